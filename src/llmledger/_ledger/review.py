"""A person's verdicts on answers: accept, flag, correct. Mixed into `SQLLedger` like the other verbs.

Every verdict is a row of `llmledger_verdicts` with the answer it judged (its text, its request's fingerprint and
its source), who gave it, when and why, and a correction's value: a redo makes a new answer, which needs its own
verdict, and the earlier ones stay. The verdict on a row's current answer is also on the row (`{step}_verdict`,
`_verdict_by`), where a redo reads it cheaply and which a new answer clears:

- accept: the answer is right. A NEEDS_REVIEW answer a person accepts is DONE; a flag on it is lifted.
- flag: the answer is wrong (`{step}_flag`, which `redo="flagged"` re-sends).
- correct: the person's value becomes the row's answer (source `person`, priced at 0, its request the current
  one), the replaced answer goes to the history, and steps that read it turn stale like after any new answer.

Rows showing the very same answer to the very same request (twins answered together, or reused) take the same
verdict, as a flag always did, so no row keeps an answer a person rejected; the verdict is recorded once, on the
row the person judged, so accuracy counts each judgement once.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import polars as pl

from llmledger._ledger.columns import names, output_as_text, output_from_text
from llmledger._ledger.engine import Con, Database
from llmledger._ledger.engine.shared import column_types, table_exists
from llmledger._ledger.history import archive, key_match
from llmledger._ledger.schema import VERDICTS_TABLE, current_output_spec, list_steps, migrate
from llmledger._ledger.states import PERSON
from llmledger._ledger.survey import Layout, check_where
from llmledger._step.output import OutputError
from llmledger._step.sqltext import q
from llmledger._time import utcnow
from llmledger.errors import InvalidInputError

VERDICTS = ("accept", "flag", "correct")


class RowChanged(InvalidInputError):
    """The row judged holds another answer, or other inputs, than the ones shown (`judge(..., seen=)`): nothing
    was written; the review view then shows the row as it is now, and asks for a new decision."""


ACCEPTED, CORRECTED = "accepted", "corrected"  # `{step}_verdict`

_VERDICT_COLUMNS = (
    "table_name, step, row_key, verdict, answer, fingerprint, source, status, corrected, reason, reviewer, judged_at"
)


def layout_of(con: Con, table: str, step: str) -> Layout:
    """The step's layout, or InvalidInputError naming the steps the store has (a store brought up to date first)."""
    migrate(con, utcnow())
    return layout_of_read(con, table, step)


def layout_of_read(con: Con, table: str, step: str) -> Layout:
    """`layout_of` for a reader, which writes nothing."""
    found = [key for t, s, key in list_steps(con, table) if s == step]
    if not found or not table_exists(con, table):
        known = [f"{t}.{s}" for t, s, _ in list_steps(con)]
        raise InvalidInputError(f"the store has no step {step!r} on table {table!r}; it has: {known or 'no steps'}")
    return Layout(table, step, found[0], [])


class ReviewVerbs:
    """A person's verdicts (mixed into SQLLedger)."""

    conn: Database

    def judge(
        self,
        table: str,
        step: str,
        *,
        verdict: str,
        by: str,
        now: datetime,
        key: Any = None,
        where: str | None = None,
        reason: str | None = None,
        answer: Any = None,
        seen: tuple[str | None, Any, str | None] | None = None,
    ) -> int:
        """Record `verdict` on the step's answers of the row `key` (or the rows matching `where`); return how many
        rows took it (twins included). One transaction: the verdicts and the rows' new state land together or not
        at all. A flag also marks matching rows without an answer (a FAILED row to send again), as `flag` did.

        `seen` is the answer a person was shown (its fingerprint and `finished_at`, and the request fingerprint of
        the inputs shown, as the review view read them): when the row's answer or inputs are other ones by now (a
        colleague's redo, the row recorded anew), the verdict is refused, writing nothing, rather than landing on an
        answer, or a request, nobody saw (found by an attack)."""

        def work(con: Con) -> int:
            layout = layout_of(con, table, step)
            if where is not None:
                check_where(con, table, where)
            match, params = _matching(con, layout, key, where, "t")
            twin_match, _ = _matching(con, layout, key, where, "o")
            c, kind = names(step, "t"), column_types(con, table)[step]
            shown = output_as_text(c[""], kind)
            judged = con.execute(
                f"SELECT {c['_status']}, {shown} IS NOT NULL, {c['_fingerprint']}::VARCHAR, {c['_finished_at']}, "
                f"{c['_request_fingerprint']}::VARCHAR FROM {q(table)} AS t WHERE {match}",
                params,
            ).fetchall()
            if seen is not None and key is not None and (not judged or tuple(judged[0][2:]) != tuple(seen)):
                now_is = "is gone" if not judged else "has another answer or other inputs"
                raise RowChanged(
                    f"the row {key!r} {now_is} since it was shown (a redo, or the row recorded anew); nothing was "
                    f"written: look at it again, then judge it"
                )
            if key is not None and not judged:
                raise InvalidInputError(f"table {table!r} has no row with key {key!r}; pass the key of one of its rows")
            busy = [s for s, *_ in judged if s in ("RUNNING", "SUBMITTED")]
            if key is not None and busy:
                raise InvalidInputError(
                    f"the row {key!r} is being answered ({busy[0]}); judge it once its run (or batch) has ended"
                )
            if verdict != "correct" and key is not None and not judged[0][1]:
                raise InvalidInputError(
                    f"the row {key!r} has no answer of step {step!r} to {verdict} (it is {judged[0][0]}); "
                    "correct it to give it one"
                )
            corrected = _corrected(con, table, step, answer) if verdict == "correct" else None
            values = {**params, "table": table, "step": step, "verdict": verdict, "by": by, "now": now,
                      "reason": reason, "corrected": corrected}  # fmt: skip
            answered = f"{shown} IS NOT NULL" if verdict != "correct" else "true"
            idle = f"{c['_status']} NOT IN ('RUNNING', 'SUBMITTED')"
            _run(
                con,
                f"INSERT INTO {VERDICTS_TABLE} ({_VERDICT_COLUMNS}) SELECT $table, $step, {layout.key_json()}, "
                f"$verdict, {shown}, {c['_fingerprint']}::VARCHAR, {c['_source']}, {c['_status']}, $corrected, "
                "$reason, $by, $now "
                f"FROM {q(table)} AS t WHERE ({match}) AND {answered} AND {idle}",
                values,
            )
            o = names(step, "o")
            twins = (  # rows asked the same request now and showing the same answer as a judged row take its verdict
                f"({c['_status']} IN ('DONE', 'NEEDS_REVIEW') AND EXISTS (SELECT 1 FROM {q(table)} AS o WHERE "
                f"{o['_request_fingerprint']} = {c['_request_fingerprint']} "
                f"AND {o['_fingerprint']} = {c['_fingerprint']} AND {output_as_text(o[''], kind)} = {shown} "
                f"AND ({twin_match})))"
            )
            target = f"(({match}) OR {twins}) AND {idle}"
            if verdict == "correct":
                archive(con, layout, now=now, reason="'corrected by ' || $by", condition=target,
                        params={k: v for k, v in values.items() if k in {"by", *params}})  # fmt: skip
            changed = _run(
                con,
                f"UPDATE {q(table)} AS t SET {_state(verdict, step, kind)} WHERE {target}"
                + (f" AND {answered}" if verdict == "accept" else "")
                + " RETURNING 1",
                values,
            )
            return len(changed)

        return int(self.conn.transaction(work, wait=60.0, exclusive=True))

    def undo_verdict(self, table: str, step: str, *, key: Any, by: str, now: datetime) -> str | None:
        """Take back `by`'s latest verdict on the row `key` (it stays in llmledger_verdicts, marked undone) and put
        the row (and its twins) back as it was: an accepted NEEDS_REVIEW answer needs review again, a flag is
        lifted, a corrected row shows the model's answer again (the person's goes to the history). Returns the
        verdict taken back, or None when `by` has none on the row."""

        def work(con: Con) -> str | None:
            layout = layout_of(con, table, step)
            match, params = key_match(con, layout, key, "t", whole=True)
            found = _run(
                con,
                f"SELECT v.verdict, v.judged_at, v.status, v.answer, v.fingerprint, "
                f"{layout.col('_request_fingerprint', 't')}::VARCHAR FROM {VERDICTS_TABLE} AS v "
                f"JOIN {q(table)} AS t ON v.row_key = {layout.key_json()} "
                f"WHERE v.table_name = $table AND v.step = $step AND v.reviewer = $by AND v.undone_at IS NULL "
                f"AND {match} ORDER BY v.judged_at DESC LIMIT 1",
                {**params, "table": table, "step": step, "by": by},
            )
            if not found:
                return None
            verdict, at, status, answer, fingerprint, request = found[0]
            _run(
                con,
                f"UPDATE {VERDICTS_TABLE} SET undone_at = $now WHERE table_name = $table AND step = $step "
                "AND reviewer = $by AND judged_at = $at",
                {"table": table, "step": step, "by": by, "at": at, "now": now},
            )
            kind = column_types(con, table)[step]
            c = names(step, "t")
            # the judged row and the twins that took its verdict: asked the same request now
            group = f"{c['_request_fingerprint']}::VARCHAR = $request"
            if verdict == "correct":
                _restore_corrected(con, layout, kind, group, by=by, at=at, request=request, status=status, now=now)
                return str(verdict)
            same = (  # of those, the rows still showing the answer judged
                f"{group} AND {c['_fingerprint']}::VARCHAR = $fingerprint AND {output_as_text(c[''], kind)} = $answer "
                f"AND {c['_source']} IS DISTINCT FROM '{PERSON}'"
            )
            judged = {"request": request, "fingerprint": fingerprint, "answer": answer}
            back = _latest_standing(con, layout, same, judged)
            if back is not None:  # an earlier verdict on this answer (on any of those rows) stands again
                sets = _state(back["verdict"], step, kind)
                again = {**judged, "by": back["reviewer"], "reason": back["reason"], "now": back["judged_at"]}
                _run(con, f"UPDATE {q(table)} AS t SET {sets} WHERE {same}", again)
            else:
                n = names(step)
                was_review = "NEEDS_REVIEW" if verdict == "accept" and status == "NEEDS_REVIEW" else None
                _run(
                    con,
                    f"UPDATE {q(table)} AS t SET {n['_verdict']} = NULL, {n['_verdict_by']} = NULL, "
                    f"{n['_flag']} = NULL, {n['_flagged_at']} = NULL, {n['_flagged_by']} = NULL, "
                    f"{n['_status']} = coalesce(CAST($was AS VARCHAR), {n['_status']}) WHERE {same}",
                    {**judged, "was": was_review},
                )
            _back_to_corrected(con, layout, kind, group, judged)
            return str(verdict)

        result = self.conn.transaction(work, wait=60.0, exclusive=True)
        return None if result is None else str(result)

    def flag(self, table: str, step: str, *, where: str, reason: str, by: str, now: datetime) -> int:
        """Mark the step's answers of rows matching `where` for redo (`redo="flagged"`), saying why and who."""
        return self.judge(table, step, verdict="flag", where=where, reason=reason, by=by, now=now)

    def answers(self, table: str, steps: list[str]) -> pl.DataFrame:
        """Per row of `table`: its key (`row_key`, as verdicts name it) and per step its current answer as text
        (`{step}`), where it came from (`{step}_source`) and what it cost (`{step}_cost_usd`). Reads only."""
        with self.conn.open(wait=60.0, read_only=True) as con:
            layouts = [layout_of_read(con, table, step) for step in steps]
            types = column_types(con, table)
            columns = ", ".join(
                f"{output_as_text(q(s), types[s])} AS {q(s)}, {q(s + '_source')}, {q(s + '_cost_usd')}" for s in steps
            )
            found: pl.DataFrame = con.sql(
                f"SELECT {layouts[0].key_json()} AS row_key, {columns} FROM {q(table)} AS t"
            ).pl()
            return found

    def verdicts(self, table: str | None = None, step: str | None = None) -> pl.DataFrame:
        """Every verdict recorded, oldest first (`llmledger_verdicts`), narrowed to a table and step."""
        with self.conn.open(wait=60.0, read_only=True) as con:
            if not table_exists(con, VERDICTS_TABLE):
                return _no_verdicts()
            found: pl.DataFrame = con.sql(
                f"SELECT {_VERDICT_COLUMNS}, undone_at FROM {VERDICTS_TABLE} "
                "WHERE (CAST($table AS VARCHAR) IS NULL OR table_name = $table) "
                "AND (CAST($step AS VARCHAR) IS NULL OR step = $step) "
                "ORDER BY judged_at, table_name, step, row_key",
                params={"table": table, "step": step},
            ).pl()
            return found


def _run(con: Con, sql: str, values: dict[str, Any]) -> list[tuple[Any, ...]]:
    """`sql` run with the values it names (DuckDB refuses a parameter a statement does not use); the rows it
    returns, if it returns any (`RETURNING`)."""
    used = set(re.findall(r"\$(\w+)", sql))
    cursor = con.execute(sql, {k: v for k, v in values.items() if k in used})
    return list(cursor.fetchall()) if "RETURNING" in sql or sql.lstrip().startswith("SELECT") else []


def _latest_standing(con: Con, layout: Layout, same: str, judged: dict[str, Any]) -> dict[str, Any] | None:
    """The latest verdict not taken back (any reviewer, any of the rows `same` names) on the answer judged."""
    rows = _run(
        con,
        f"SELECT v.verdict, v.reviewer, v.reason, v.judged_at FROM {VERDICTS_TABLE} AS v JOIN {q(layout.table)} AS t "
        f"ON v.row_key = {layout.key_json()} WHERE v.table_name = $v_table AND v.step = $v_step "
        f"AND v.fingerprint = $fingerprint AND v.answer = $answer AND v.undone_at IS NULL AND v.verdict <> 'correct' "
        f"AND {same} ORDER BY v.judged_at DESC LIMIT 1",
        {**judged, "v_table": layout.table, "v_step": layout.step},
    )
    if not rows:
        return None
    return dict(zip(("verdict", "reviewer", "reason", "judged_at"), rows[0], strict=True))


def _back_to_corrected(con: Con, layout: Layout, kind: str, group: str, judged: dict[str, Any]) -> None:
    """An accept or a flag taken back from a person's own answer: the row is `corrected` again, by the person who
    wrote it (found in an attack: it stayed `accepted`, its accept marked undone)."""
    c, n = names(layout.step, "t"), names(layout.step)
    shown = output_as_text(c[""], kind)
    corrector = (  # the correction that wrote this answer: made when the answer was (twins took it at once)
        f"(SELECT v.reviewer FROM {VERDICTS_TABLE} AS v WHERE v.table_name = $v_table AND v.step = $v_step "
        f"AND v.verdict = 'correct' AND v.undone_at IS NULL AND v.judged_at = {c['_finished_at']} "
        f"AND v.corrected = {shown} ORDER BY v.judged_at DESC LIMIT 1)"
    )
    _run(
        con,
        f"UPDATE {q(layout.table)} AS t SET {n['_verdict']} = '{CORRECTED}', {n['_verdict_by']} = {corrector}, "
        f"{n['_flag']} = NULL, {n['_flagged_at']} = NULL, {n['_flagged_by']} = NULL WHERE {group} "
        f"AND {c['_source']} = '{PERSON}' AND {c['_fingerprint']}::VARCHAR = $fingerprint AND {shown} = $answer",
        {**judged, "v_table": layout.table, "v_step": layout.step},
    )


def _restore_corrected(
    con: Con, layout: Layout, kind: str, group: str, *, by: str, at: Any, request: str, status: str | None, now: Any
) -> None:
    """Take back `by`'s correction made at `at`: on the rows of `group` that still show it (a later correction by
    someone else stands), the answer it replaced comes back from the history, or, where the model had given none,
    the row goes back to the status it had; the person's answer goes to the history in turn."""
    from llmledger._ledger.schema import HISTORY_TABLE

    c, n = names(layout.step, "t"), names(layout.step)
    showing = (  # parameters of its own: PostgreSQL deduces one type per parameter, and archive's differ
        f"{group} AND {c['_source']} = '{PERSON}' AND {c['_verdict_by']} = $c_by AND {c['_finished_at']} = $c_at"
    )
    from_history = (
        f"h.table_name = $h_table AND h.step = $h_step AND h.row_key = {layout.key_json()} "
        f"AND h.reason = $h_reason AND h.replaced_at = $c_at"
    )
    own = {"request": request, "c_by": by, "c_at": at, "h_table": layout.table, "h_step": layout.step,
           "h_reason": "corrected by " + by}  # fmt: skip
    archive(con, layout, now=now, reason="'correction undone by ' || $by", condition=showing,
            params={**{k: own[k] for k in ("request", "c_by", "c_at")}, "by": by})  # fmt: skip
    usage = ", ".join(f"{n[s]} = h.{s[1:]}" for s in ("_input_tokens", "_output_tokens", "_cost_usd"))
    _run(
        con,
        f"UPDATE {q(layout.table)} AS t SET {n['']} = {output_from_text('h.output', kind)}, "
        f"{n['_model']} = h.model, {n['_fingerprint']} = CAST(h.fingerprint AS UUID), {usage}, "
        f"{n['_finished_at']} = h.finished_at, {n['_status']} = h.status, {n['_raw']} = h.raw, "
        f"{n['_source']} = h.source, {n['_stop_reason']} = h.stop_reason, {n['_verdict']} = NULL, "
        f"{n['_verdict_by']} = NULL, {n['_cache_write_tokens']} = NULL, {n['_cache_read_tokens']} = NULL "
        f"FROM {HISTORY_TABLE} AS h WHERE {from_history} AND {showing}",
        own,
    )
    cleared = ", ".join(f"{n[s]} = NULL" for s in ("", "_model", "_fingerprint", "_input_tokens", "_output_tokens",
                                                   "_cache_write_tokens", "_cache_read_tokens", "_cost_usd",
                                                   "_finished_at", "_source", "_verdict", "_verdict_by"))  # fmt: skip
    _run(  # a row the model had not answered: back to the status it had, with no answer
        con,
        f"UPDATE {q(layout.table)} AS t SET {cleared}, {n['_status']} = coalesce(CAST($was AS VARCHAR), "
        f"'NOT_STARTED') WHERE {showing}",
        {**{k: own[k] for k in ("request", "c_by", "c_at")}, "was": status},
    )


def _matching(con: Con, layout: Layout, key: Any, where: str | None, alias: str) -> tuple[str, dict[str, Any]]:
    """SQL over the fact table (as `alias`): the rows a verdict names, by key or by `where`."""
    if (key is None) == (where is None):
        raise InvalidInputError("name the rows judged with key= (one row) or where= (a SQL predicate), not both")
    if key is not None:
        return key_match(con, layout, key, alias, whole=True)
    return f"coalesce(({where}), false)", {}


def _corrected(con: Con, table: str, step: str, answer: Any) -> str:
    """A correction as the step stores it: text, or for a typed step JSON checked against its schema."""
    spec = current_output_spec(con, table, step)
    if spec is None:
        if not isinstance(answer, str) or not answer.strip():
            raise InvalidInputError(f"step {step!r} answers text: correct it with answer= a non-empty string")
        return answer.replace("\x00", "\ufffd")
    text = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False, default=str)
    try:
        return spec.check(text)
    except OutputError as exc:
        raise InvalidInputError(
            f"the correction does not fit step {step!r}'s output schema: {exc}. Nothing was written."
        ) from None


def _state(verdict: str, step: str, kind: str) -> str:
    """The SET list that gives a row the state of `verdict`."""
    c = names(step)
    unflag = f"{c['_flag']} = NULL, {c['_flagged_at']} = NULL, {c['_flagged_by']} = NULL"
    if verdict == "accept":  # a NEEDS_REVIEW answer a person accepts is DONE
        return (
            f"{c['_verdict']} = '{ACCEPTED}', {c['_verdict_by']} = $by, {unflag}, "
            f"{c['_status']} = CASE WHEN {c['_status']} = 'NEEDS_REVIEW' THEN 'DONE' ELSE {c['_status']} END"
        )
    if verdict == "flag":
        return (
            f"{c['_flag']} = coalesce($reason, 'flagged by ' || $by), {c['_flagged_at']} = $now, "
            f"{c['_flagged_by']} = $by, {c['_verdict']} = NULL, {c['_verdict_by']} = NULL"
        )
    usage = ", ".join(f"{c[s]} = 0" for s in ("_input_tokens", "_output_tokens", "_cache_write_tokens",
                                              "_cache_read_tokens", "_cost_usd"))  # fmt: skip
    cleared = ", ".join(f"{c[s]} = NULL" for s in ("_model", "_stop_reason", "_error", "_raw", "_latency_ms",
                                                   "_batch_id", "_custom_id", "_pack"))  # fmt: skip
    return (
        f"{c['']} = {output_from_text('$corrected', kind)}, {c['_status']} = 'DONE', {c['_source']} = '{PERSON}', "
        f"{c['_fingerprint']} = {c['_request_fingerprint']}, {c['_finished_at']} = $now, {usage}, {cleared}, "
        f"{c['_verdict']} = '{CORRECTED}', {c['_verdict_by']} = $by, {unflag}"
    )


def _no_verdicts() -> pl.DataFrame:
    return pl.DataFrame(
        schema={
            **{name: pl.String for name in _VERDICT_COLUMNS.split(", ")},
            "judged_at": pl.Datetime("us"),
            "undone_at": pl.Datetime("us"),
        }
    )
