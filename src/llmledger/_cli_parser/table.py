"""The command line as a table: a `Verb` is a name (and aliases), its help, the argument groups it takes and the
function that runs it; `build` makes the argparse parser of a table of them, and `usage` the text `llmledger --help`
shows above the verbs, from the same table and parsers, so no verb can be left out of it.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from llmledger._cli_parser.args import CliParser, Group

Runner = Callable[[argparse.Namespace], "int | None"]


@dataclass(frozen=True)
class Verb:
    """One verb of the command line.

    `twin` is the Python function it is a thin twin of (None for `demo` and `simulator`); `help` says what it does;
    `groups` add its arguments, shared or its own, in the order --help lists them; `run` runs it on the parsed
    arguments (`cli.main` has filled in --table and --step, and handles errors and Ctrl-C) and returns the exit
    status (None: 0).
    """

    name: str
    help: str
    run: Runner
    groups: tuple[Group, ...] = ()
    twin: str | None = None
    aliases: tuple[str, ...] = ()

    @property
    def line(self) -> str:
        """The verb's one line in the list of verbs."""
        return f"{self.twin}: {self.help}" if self.twin else self.help

    @property
    def infers(self) -> tuple[str, ...]:
        """The arguments left out (None) that are the store's only table or step."""
        return tuple(name for group in self.groups for name in group.infers)


def build(verbs: Sequence[Verb], *, prog: str, version: str, epilogue: str) -> CliParser:
    """The parser of the whole command line: one subparser per verb (its aliases the same parser); the parsed
    namespace's `verb` is the `Verb`. Its description is `usage(...)` of the same verbs."""
    top = CliParser(prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"{prog} {version}")
    sub = top.add_subparsers(dest="command", required=True)
    for verb in verbs:
        made = sub.add_parser(verb.name, aliases=list(verb.aliases), help=verb.line)
        made.set_defaults(verb=verb)
        for group in verb.groups:
            group.add_to(made)
    top.description = usage(verbs, sub.choices, prog=prog, epilogue=epilogue)
    return top


def synopsis(parser: argparse.ArgumentParser) -> str:
    """A verb's arguments in a few words: the positional ones, the options it needs, then [options] if it takes
    more: `STORE --where WHERE --reason REASON [options]`."""
    words, more = [], False
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        metavar = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
        if action.nargs in ("+", "*"):
            metavar += " ..."
        if not action.option_strings:
            words.append(metavar)
        elif action.required:
            words.append(f"{action.option_strings[0]} {metavar}")
        else:
            more = True
    return " ".join([*words, "[options]"] if more else words)


def usage(verbs: Sequence[Verb], parsers: Mapping[str, argparse.ArgumentParser], *, prog: str, epilogue: str) -> str:
    """What `llmledger --help` shows above the verbs: each verb's synopsis and what it is, then `epilogue`."""
    out = ["The command line: each verb is a thin twin of a Python function.", ""]
    for verb in verbs:
        out.append(f"  {prog} {verb.name} {synopsis(parsers[verb.name])}")
        out += textwrap.wrap(verb.line, 100, initial_indent=" " * 6, subsequent_indent=" " * 6)
    aliased = [verb for verb in verbs if verb.aliases]
    if aliased:
        names = _listed([f"`{verb.aliases[0]}`" for verb in aliased])
        out += ["", f"{names} are the same verbs as {_listed([f'`{v.name}`' for v in aliased])}, named like their"]
        out[-1] += " Python twins."
    return "\n".join([*out, epilogue])


def _listed(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]
