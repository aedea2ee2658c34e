"""`where=` is one condition over the fact table, never SQL to run: its shape is checked before any engine sees it.

The text is pasted into the ledger's own statements as `(<where>)` (claims, surveys, flag, reset). If it could
close that parenthesis, end the statement with `;` or comment out the rest, it would be a way to run any SQL
(on PostgreSQL, through a query without parameters, psycopg runs every statement of a text). A text whose
parentheses balance outside its string literals and quoted names, and that has no `;`, no comment and no
dollar quoting there, stays one parenthesised expression wherever it is pasted; the engine then binds it
(`survey.check_where`) to say whether it is a valid condition on the table's columns.
"""

from __future__ import annotations

from llmledger.errors import WhereClauseError

_EXAMPLE = 'pass one condition such as "label = \'spam\'" or "id IN (3, 7)"'


def where_shape_problem(where: str) -> str | None:
    """Why `where` is not one self-contained expression (None when it is), read outside quotes as SQL reads it."""
    depth, i, n = 0, 0, len(where)
    problems: list[str] = []  # in the order found; a ';' is named first, whatever came before it
    while i < n:
        ch = where[i]
        if ch in "'\"":
            backslashes = ch == "'" and i > 0 and where[i - 1] in "eE" and (i < 2 or not where[i - 2].isalnum())
            i += 1
            while i < n:
                if backslashes and where[i] == "\\":
                    i += 2
                    continue
                if where[i] == ch:
                    if i + 1 < n and where[i + 1] == ch:  # '' inside a literal, "" inside a name
                        i += 2
                        continue
                    break
                i += 1
            else:
                problems.append(f"it has a {'string literal' if ch == chr(39) else 'quoted name'} that is never closed")
        elif ch == ";":
            return "it is more than one SQL statement (a ';' outside quotes would end the statement)"
        elif where.startswith("--", i) or where.startswith("/*", i):
            problems.append("it has an SQL comment (it would hide the rest of the statement)")
        elif ch == "$" and (i + 1 < n and (where[i + 1] == "$" or where[i + 1].isalpha() or where[i + 1] == "_")):
            problems.append("it has '$' quoting or a '$' parameter outside quotes")
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                problems.append("it closes a parenthesis it never opened")
                depth = 0
        i += 1
    if depth:
        problems.append("it opens a parenthesis it never closes")
    return problems[0] if problems else None


def check_where_shape(where: str | None) -> None:
    """Refuse, with WhereClauseError, a `where` that is not one self-contained expression (see the module)."""
    if where is None:
        return
    problem = where_shape_problem(where)
    if problem:
        raise WhereClauseError(f"where={where!r} is not one SQL condition: {problem}; {_EXAMPLE}. Nothing was changed.")
