"""`where=` is one condition over the fact table, never SQL to run: its shape is checked before any engine sees it.

The text is pasted into the ledger's own statements as `(<where>)` (claims, surveys, flag, reset). If it could
close that parenthesis, end the statement with `;` or comment out the rest, it would be a way to run any SQL
(on PostgreSQL, through a query without parameters, psycopg runs every statement of a text). A text whose
parentheses balance outside its string literals and quoted names, and that has no `;`, no comment and no
dollar quoting there, stays one parenthesised expression wherever it is pasted; the engine then binds it
(`survey.check_where`) to say whether it is a valid condition on the table's columns.
"""

from __future__ import annotations

import re

from llmledger.errors import WhereClauseError

_EXAMPLE = 'pass one condition such as "label = \'spam\'" or "id IN (3, 7)"'

# The functions a condition may call: pure ones, on both engines. Any other call is refused, because a function
# may do anything the database lets it (on PostgreSQL `pg_sleep`, `pg_advisory_lock`, `set_config`, `nextval`,
# `dblink`: found in a trial, `compare(where="pg_sleep(3) IS NULL")` slept), and `where=` is pasted into the
# ledger's own claims and writes. SQL's words that take a parenthesis (IN, EXISTS, CAST, ...) are not calls.
SAFE_FUNCTIONS = frozenset(
    """
    abs ceil ceiling floor round trunc mod sign sqrt power ln log exp greatest least coalesce nullif lower upper
    length char_length character_length octet_length trim ltrim rtrim btrim substr substring left right replace
    concat concat_ws strpos position starts_with ends_with contains split_part reverse
    regexp_matches regexp_replace regexp_like like_escape md5 hash date_trunc date_part extract age make_date
    to_char to_date to_timestamp epoch array_length cardinality len list_contains array_contains json_extract
    json_extract_string to_json chr ascii struct_extract json_extract_path_text jsonb_extract_path_text to_jsonb
    llmledger_jsonb isnan isinf
    """.split()  # noqa: SIM905
)
# Functions whose result grows with an argument, not with the row (`repeat(text, 1000000000)`: gigabytes of one
# text, found in a trial): a condition that names one could take the database's memory, so it is refused by name.
_UNBOUNDED = frozenset({
    "repeat", "lpad", "rpad", "range", "generate_series", "generate_subscripts", "string_agg", "array_agg", "list",
    "list_resize", "array_fill", "unnest",
})  # fmt: skip
# Types that take modifiers (`DECIMAL(10,2)`, `VARCHAR(20)`): after `::` or a CAST's `AS`, with integers alone
# between the parentheses, such a name is a type, not a call.
_MODIFIED_TYPES = frozenset({
    "decimal", "numeric", "dec", "varchar", "char", "character", "varying", "bpchar", "nvarchar", "bit", "varbit",
    "timestamp", "timestamptz", "time", "timetz", "interval", "float",
})  # fmt: skip
_TYPE_POSITION = re.compile(r"(?:::|\bas)\s*(?:[A-Za-z_][A-Za-z0-9_]*\s+)*$", re.IGNORECASE)
_MODIFIERS = re.compile(r"\s*\d+\s*(?:,\s*\d+\s*)?\)")
_SQL_WORDS = frozenset(
    """
    in and or not exists any all some cast try_cast values select from where is between like ilike similar case
    when then else end as on over filter row array
    """.split()  # noqa: SIM905
)
_CALL = re.compile(r"([A-Za-z_][A-Za-z0-9_$.]*)\s*\(")


def where_shape_problem(where: str) -> str | None:
    """Why `where` is not one self-contained expression (None when it is), read outside quotes as SQL reads it."""
    depth, i, n = 0, 0, len(where)
    problems: list[str] = []  # in the order found; a ';' is named first, whatever came before it
    outside: list[str] = []  # the text outside quotes, a quoted part standing as one mark
    while i < n:
        ch = where[i]
        outside.append(ch if ch not in "'\"" else (" '' " if ch == "'" else ' "" '))
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
    problems.extend(_call_problems("".join(outside)))
    return problems[0] if problems else None


def _call_problems(outside: str) -> list[str]:
    """Why the calls of a condition (its text outside quotes) may not run: a function not in SAFE_FUNCTIONS."""
    if re.search(r'""\s*\(', outside):
        return ["it calls a function by a quoted name (only the pure functions llmledger allows may be called)"]
    if re.search(r"\bfrom\s*''", outside, re.IGNORECASE):  # DuckDB reads a file named in a FROM: read_csv unnamed
        return ["it reads from a file (FROM 'path'); a condition reads the fact table's columns"]
    if re.search(r"\brecursive\b", outside, re.IGNORECASE):  # a recursive query may never end: pg_sleep unnamed
        return ["it has a recursive query, which may run for ever; a condition reads the fact table's columns"]
    for match in _CALL.finditer(outside):
        name = match.group(1).lower()
        if name in _SQL_WORDS or name in SAFE_FUNCTIONS or _type_modifiers(outside, match):
            continue
        if name in _UNBOUNDED:
            return [
                f"it calls {match.group(1)}(), whose result can grow without bound (a text or a series as large as "
                "a number asks for), so one condition could take the database's memory"
            ]
        return [
            f"it calls {match.group(1)}(), and a condition may call only pure functions such as lower(), length(), "
            "coalesce(), date_trunc() (a function can do anything the database allows: sleep, lock, write; the "
            "list: llmledger._ledger.where.SAFE_FUNCTIONS)"
        ]
    return []


def _type_modifiers(outside: str, call: re.Match[str]) -> bool:
    """Whether what reads as a call is a type with its modifiers, as in `CAST(price AS DECIMAL(10,2))` or
    `price::NUMERIC(5)`: a type that takes them, in a type's place, with integers alone between the parentheses."""
    return (
        call.group(1).lower() in _MODIFIED_TYPES
        and _TYPE_POSITION.search(outside, 0, call.start()) is not None
        and _MODIFIERS.match(outside, call.end()) is not None
    )


def check_where_shape(where: str | None) -> None:
    """Refuse, with WhereClauseError, a `where` that is not one self-contained expression (see the module)."""
    if where is None:
        return
    problem = where_shape_problem(where)
    if problem:
        raise WhereClauseError(f"where={where!r} is not one SQL condition: {problem}; {_EXAMPLE}. Nothing was changed.")
