"""The command line below `cli.main`: its verbs as a table (`verbs.VERBS`: each verb's name and aliases, help,
argument groups and the function that runs it), and the argparse parser and `llmledger --help` text made from
that table (`parser()`).

    args.py     the parser that refuses in one line, value checks, the argument groups verbs share
    faults.py   `llmledger simulator`'s options, one per fault of `Simulator`
    table.py    `Verb`; the parser and the usage text made from a table of verbs
    verbs.py    the table: every verb
    runs.py     the function that runs each verb, calling its Python twin

`docs/gen_reference.py` writes the CLI reference from this parser's `--help` without running anything.
"""

from __future__ import annotations

from llmledger._cli_parser.args import CliParser, port, positive
from llmledger._cli_parser.faults import _FAULT_OPTIONS, _FAULTS, _FAULTS_AS_TOLD
from llmledger._cli_parser.table import Verb, build
from llmledger._cli_parser.verbs import VERBS

__all__ = ["VERBS", "_FAULTS", "_FAULTS_AS_TOLD", "_FAULT_OPTIONS", "CliParser", "Verb", "parser", "port", "positive"]

# What `llmledger --help` says under the list of verbs.
EPILOGUE = """--table and --step may be left out when the store has only one.
STORE is a DuckDB file, or a PostgreSQL URL (postgresql://user@host:5432/db; pip install 'llmledger[postgresql]').
"""


def parser() -> CliParser:
    """The whole command line (docs/gen_reference.py writes the CLI reference from its `--help`)."""
    from llmledger._version import __version__

    return build(VERBS, prog="llmledger", version=__version__, epilogue=EPILOGUE)


def usage() -> str:
    """What `llmledger --help` shows above the verbs: every verb of the table, its synopsis and its twin."""
    return parser().description or ""
