"""SQL text that a step's values are rendered into: quoted identifiers.

It sits with the step's values (not in the ledger) because a prompt template and an output schema are
rendered as SQL expressions over the fact table's columns, and those must quote the user's column names the
one way the ledger does.
"""


def q(name: str) -> str:
    """Quote an identifier for SQL."""
    return '"' + name.replace('"', '""') + '"'
