"""Properties over the inputs users control, searched by hypothesis (derandomized: CI sees the same examples each
run; `HYPOTHESIS_PROFILE=deep pytest tests/test_properties.py` searches ten times as many, at random).

The invariant is the ledger's promise for a call: either it is refused with an llmledger error before anything is
written (every table of the store as it was), or every row ends with the answer to its own request and what the
call does not own is unchanged.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import tempfile
from pathlib import Path
from typing import Any

import anthropic
import duckdb
import polars as pl
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import llmledger
from llmledger import LedgerError, Simulator, apply_llm
from llmledger._ledger.columns import STEP_COLUMNS
from llmledger.simulator import default_reply

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.register_profile("deep", parent=settings.get_profile("ci"), derandomize=False, max_examples=400)
# The run with the lowest dependency versions (.ci/run) proves the floors: every property runs, with a quarter of
# the examples (the search itself is proven by the main run).
settings.register_profile("floors", parent=settings.get_profile("ci"))
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
DEEP = os.environ.get("HYPOTHESIS_PROFILE") == "deep"
FLOORS = os.environ.get("HYPOTHESIS_PROFILE") == "floors"


def _examples(n: int) -> int:
    return n * 10 if DEEP else max(3, n // 4) if FLOORS else n


def _tables(store: Path) -> dict[str, list[str]]:
    with duckdb.connect(str(store), read_only=True) as con:
        names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
        return {t: sorted(map(repr, con.execute(f'SELECT * FROM "{t}"').fetchall())) for t in names}


def _columns(store: Path, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    with duckdb.connect(str(store), read_only=True) as con:
        cols = ", ".join(f'"{c}"' for c in columns)
        return con.execute(f'SELECT {cols} FROM "{table}" ORDER BY id').fetchall()


@pytest.fixture(scope="module")
def sim() -> Any:
    with Simulator() as s:
        yield s


@pytest.fixture(scope="module")
def client(sim: Simulator) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="test-key")


FRAME = pl.DataFrame(
    {
        "id": list(range(8)),
        "text": [f"text {i}; it's (row) {i} -- /* {i} */" for i in range(8)],
        "label": ["spam", "ham"] * 4,
        "n": [i % 3 for i in range(8)],
    }
)


@pytest.fixture(scope="module")
def answered(tmp_path_factory: pytest.TempPathFactory, client: anthropic.AsyncAnthropic) -> Path:
    """A store with table `t`, two answered steps `s` and `sentiment`: every property copies it first."""
    store = tmp_path_factory.mktemp("props") / "base.duckdb"
    for step in ("s", "sentiment"):
        apply_llm(
            FRAME, step, prompt=step + ": {text} [{label}]", store=store, table="t", client=client, progress=False
        )
    return store


def _copy(answered: Path) -> Path:
    folder = Path(tempfile.mkdtemp(dir=answered.parent))
    target = folder / "ledger.duckdb"
    target.write_bytes(answered.read_bytes())
    return target


# -- where= ----------------------------------------------------------------------------------------------------------
FRAGMENTS = [
    "id",
    "n",
    "label",
    "text",
    "=",
    "<>",
    "<",
    " ",
    "(",
    ")",
    "'",
    "''",
    '"',
    ";",
    "--",
    "/*",
    "*/",
    "1",
    "3",
    "'spam'",
    "'a;b'",
    "AND",
    "OR",
    "NOT",
    "IN (1, 2)",
    "LIKE '%row%'",
    "true",
    "false",
    "NULL",
    "COMMIT",
    "DROP TABLE t",
    "DELETE FROM t",
    "SELECT",
    "$$",
    "$1",
    "%",
    "s_status",
    "llmledger_runs",
    "\n",
    "E'\\''",
]


@settings(max_examples=_examples(60))
@given(parts=st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=9))
def test_a_where_is_refused_writing_nothing_or_flags_exactly_the_rows_it_selects(
    answered: Path, parts: list[str]
) -> None:
    where = " ".join(parts)
    store = _copy(answered)
    before = _tables(store)
    try:
        flagged = llmledger.flag(store, "t", "s", where=where, reason="prop")
    except LedgerError:
        assert _tables(store) == before, f"a refused where={where!r} changed the store"
        return
    # known to be one condition now: count what it selects, read-only, and compare
    with duckdb.connect(str(store), read_only=True) as con:
        expected = con.execute(f"SELECT count(*) FROM t WHERE coalesce(({where}), false)").fetchone()[0]
    assert flagged == expected
    after = _tables(store)
    assert set(after) == set(before)
    keep = [c for c in ("id", "text", "label", "n", "s", "s_status", "sentiment", "sentiment_status")]
    assert _columns(store, "t", keep) == _columns(answered, "t", keep), f"where={where!r} changed other columns"


_PREPARED: set[str] = set()


@settings(max_examples=_examples(12))
@given(parts=st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=9))
def test_a_where_on_postgresql_is_refused_or_flags_exactly_its_rows(
    pg_url: str, client: anthropic.AsyncAnthropic, parts: list[str]
) -> None:
    where = " ".join(parts)
    if pg_url not in _PREPARED:  # once per database (the fixture's, one per test function)
        apply_llm(FRAME, "s", prompt="s: {text}", store=pg_url, table="t", client=client, progress=False)
        _PREPARED.add(pg_url)
    llmledger.sql(pg_url, "UPDATE t SET s_flag = NULL", write=True)
    before = llmledger.sql(pg_url, "SELECT id, text, label, n, s, s_status FROM t ORDER BY id")
    tables = llmledger.sql(pg_url, "SELECT count(*) AS n FROM information_schema.tables")["n"][0]
    try:
        flagged = llmledger.flag(pg_url, "t", "s", where=where, reason="prop")
    except LedgerError:
        flagged = 0
    assert llmledger.sql(pg_url, "SELECT id, text, label, n, s, s_status FROM t ORDER BY id").equals(before)
    assert llmledger.sql(pg_url, "SELECT count(*) AS n FROM information_schema.tables")["n"][0] == tables
    assert llmledger.sql(pg_url, "SELECT count(*) AS n FROM t WHERE s_flag IS NOT NULL")["n"][0] == flagged


# -- step names ------------------------------------------------------------------------------------------------------
SUFFIXES = [c.suffix for c in STEP_COLUMNS if c.suffix]
BASES = ["s", "sentiment", "text", "label", "n", "id", "new", "s_", "S", "Sentiment", "TEXT"]


@settings(max_examples=_examples(30))
@given(base=st.sampled_from(BASES), suffix=st.sampled_from(["", "", *SUFFIXES, "_x", "_v2"]), upper=st.booleans())
def test_a_new_step_is_refused_or_owns_only_new_columns(
    answered: Path, client: anthropic.AsyncAnthropic, sim: Simulator, base: str, suffix: str, upper: bool
) -> None:
    step = (base + suffix).upper() if upper else base + suffix
    assume(step not in ("s", "sentiment"))  # those redefine a step: their rows go stale, as test_reruns checks
    store = _copy(answered)
    before = _tables(store)
    try:
        out = apply_llm(FRAME, step, prompt="new: {text} {n}", store=store, table="t", client=client, progress=False)
    except LedgerError:
        assert _tables(store) == before, f"a refused step {step!r} changed the store"
        return
    assert out[step].to_list() == [default_reply(f"new: {t} {n}") for t, n in FRAME.select("text", "n").rows()]
    keep = ["id", "text", "label", "n", *(f"{s}{c.suffix}" for s in ("s", "sentiment") for c in STEP_COLUMNS)]
    assert _columns(store, "t", keep) == _columns(answered, "t", keep), f"step {step!r} changed other columns"


# -- keys ------------------------------------------------------------------------------------------------------------
_BASE = dt.datetime(2021, 5, 6, 7, 8, 9)
KEY_VALUES: dict[str, st.SearchStrategy[pl.Series]] = {
    "int": st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=6, unique=True).map(pl.Series),
    # near-duplicates: case, spaces, and é both composed and as e + a combining accent
    "text": st.lists(
        st.lists(st.sampled_from(["a", "A", " ", "e\u0301", "\u00e9", "'", '"', "\\", "%"]), max_size=3).map("".join),
        min_size=1,
        max_size=6,
        unique=True,
    ).map(pl.Series),
    "ns": st.lists(st.integers(0, 3000), min_size=1, max_size=6, unique=True).map(
        lambda v: pl.Series([_BASE] * len(v)).cast(pl.Datetime("ns")) + pl.Series(v).cast(pl.Duration("ns"))
    ),
    "float": st.lists(
        st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=6, unique=True
    ).map(lambda v: pl.Series(v, dtype=pl.Float64)),
    "date": st.lists(st.dates(), min_size=1, max_size=6, unique=True).map(pl.Series),
    "bool": st.lists(st.booleans(), min_size=1, max_size=2, unique=True).map(pl.Series),
}
_counter = itertools.count()


@settings(max_examples=_examples(30))
@given(kinds=st.lists(st.sampled_from(sorted(KEY_VALUES)), min_size=1, max_size=2, unique=True), data=st.data())
def test_a_key_is_refused_writing_nothing_or_every_row_gets_its_own_answer(
    tmp_path_factory: pytest.TempPathFactory,
    client: anthropic.AsyncAnthropic,
    sim: Simulator,
    kinds: list[str],
    data: st.DataObject,
) -> None:
    columns = {f"k{i}": data.draw(KEY_VALUES[kind], label=kind) for i, kind in enumerate(kinds)}
    height = min(len(c) for c in columns.values())
    df = pl.DataFrame({k: v.head(height) for k, v in columns.items()})
    df = df.unique(maintain_order=True).with_columns(
        pl.format("key row {} of {}", pl.int_range(pl.len()), next(_counter)).alias("text")
    )
    store = tmp_path_factory.mktemp("keys") / "sub" / "ledger.duckdb"
    common = {"key": list(columns), "store": store, "table": "t", "client": client, "progress": False}
    try:
        out = apply_llm(df, "s", prompt="{text}", **common)
    except LedgerError:
        assert not store.exists() and not store.parent.exists(), "a refused key left a store behind"
        return
    assert out["s"].to_list() == [default_reply(t) for t in df["text"]]
    assert out.select(list(columns)).equals(df.select(list(columns)))
    paid = sim.stats()["paid"]
    again = apply_llm(df.reverse(), "s", prompt="{text}", **common)
    assert sim.stats()["paid"] == paid, "a rerun (in another order) finds every row"
    assert again["s"].to_list() == [default_reply(t) for t in df.reverse()["text"]]


# -- identical requests across runs ------------------------------------------------------------------------------------
@settings(max_examples=_examples(25))
@given(texts=st.lists(st.sampled_from("abcdef"), min_size=1, max_size=30), data=st.data())
def test_runs_sharing_a_step_never_hold_one_request_at_once_and_claim_each_row_once(
    tmp_path_factory: pytest.TempPathFactory, texts: list[str], data: st.DataObject
) -> None:
    """Any interleaving of claims (any sizes, any `where=` per run) and commits by up to three runs of one step over
    rows with repeated texts: no request is ever held by two runs when both runs' `where=` cover all its rows, no
    row is claimed twice, and every row is claimed once in the end."""
    from llmledger._ledger import RunParams, StepDefinition, open_ledger
    from llmledger._ledger.columns import RESULT_SCHEMA
    from llmledger._ledger.states import Redo
    from llmledger._step.prompt import plan_prompt
    from llmledger._step.request import RequestSpec
    from llmledger._time import utcnow

    df = pl.DataFrame({"id": list(range(len(texts))), "text": texts})
    ledger = open_ledger(tmp_path_factory.mktemp("twins") / "ledger.duckdb")
    definition = StepDefinition(
        table="t",
        step="s",
        key=["id"],
        request=RequestSpec(model="m", max_tokens=5),
        prompt=plan_prompt("Say {text}", df),
    )

    def params(where: str | None) -> RunParams:
        now = utcnow()
        return RunParams(
            max_attempts=2, redo=Redo.NONE, run_started=now, stale_before=now - dt.timedelta(hours=1), where=where
        )

    ledger.prepare(definition, df, params("false"), dedupe=True)
    wheres = [
        data.draw(st.sampled_from([None, None, "id % 2 = 0", "text <> 'a'"]), label=f"where {n}")
        for n in range(data.draw(st.integers(1, 3), label="runs"))
    ]
    runs = [ledger.resume("t", "s", params(w), dedupe=True) for w in wheres]
    held: list[dict[str, Any]] = [{} for _ in runs]  # per run: claimed rows not committed yet, by id
    claimed: list[int] = []
    texts_of = dict(enumerate(texts))
    for _ in range(data.draw(st.integers(1, 40), label="steps")):
        n = data.draw(st.integers(0, len(runs) - 1), label="run")
        if held[n] and data.draw(st.booleans(), label="commit?"):
            rows = list(held[n].values())
            results = pl.from_dicts(
                [
                    {
                        "id": r["id"],
                        "status": "DONE",
                        "output": "x",
                        "attempts": 1,
                        "error": None,
                        "input_tokens": 1,
                        "output_tokens": 1,
                        "cost_usd": 0.0,
                        "stop_reason": "end_turn",
                        "model": "m",
                        "fingerprint": r["fingerprint"],
                        "finished_at": utcnow(),
                    }
                    for r in rows
                ],
                schema={"id": pl.Int64} | RESULT_SCHEMA,
            )
            ledger.commit(runs[n], results, now=utcnow())
            held[n].clear()
            continue
        got = ledger.claim(runs[n], data.draw(st.integers(1, 5), label="n"), claimant=f"h/{n}/r{n}", now=utcnow())
        claimed += [r["id"] for r in got]
        held[n].update({r["id"]: r for r in got})
        for text in {texts_of[r["id"]] for r in got}:
            others = [m for m in range(len(runs)) if m != n and any(texts_of[i] == text for i in held[m])]
            covered = all(_covers(wheres[m], i, text) for m in [n, *others] for i, t in texts_of.items() if t == text)
            assert not (others and covered), f"text {text!r} held by runs {[n, *others]} at once"
    for n, run in enumerate(runs):  # each run claims what is left to it
        while got := ledger.claim(run, 5, claimant=f"h/{n}/r{n}", now=utcnow()):
            claimed += [r["id"] for r in got]
    assert len(claimed) == len(set(claimed)), "a row was claimed twice"
    left = ledger.counts("t").select("NOT_STARTED").item()
    reachable = {i for i, t in texts_of.items() if any(_covers(w, i, t) for w in wheres)}
    assert set(claimed) == reachable and left == len(texts) - len(reachable)


def _covers(where: str | None, row: int, text: str) -> bool:
    """Whether a run's `where=` (one of the property's) selects the row."""
    return where is None or (where == "id % 2 = 0" and row % 2 == 0) or (where == "text <> 'a'" and text != "a")


# -- column and key names --------------------------------------------------------------------------------------------
# Names the ledger's SQL or its frames use beside the frame's own columns, SQL words, and odd spellings: a frame
# column `p` once replaced every row's prompt (the rendered prompt's alias), a key `status` broke commits.
NAMES = [
    "p",
    "fp",
    "up",
    "legacy",
    "prompt",
    "status",
    "output",
    "version",
    "attempts",
    "fingerprint",
    "custom_id",
    "batch_id",
    "was_done",
    "error",
    "t",
    "i",
    "r",
    "s",
    "k",
    "w",
    "n",
    "one",
    "key",
    "select",
    "from",
    "order",
    "group",
    "table",
    "value",
    "exists",
    "changed",
    "current",
    "eligible",
    "in_where",
    "waiting",
    "stale",
    "llmledger_x",
    "Text",
    "TEXT",
    "a b",
    "ü",
    "col-1",
    "1st",
    "x_status",
    "s_prompt",
    "id",
    "text",
]


@settings(max_examples=_examples(40))
@given(
    key=st.sampled_from(NAMES), field=st.sampled_from(NAMES), other=st.sampled_from(NAMES), key_is_text=st.booleans()
)
def test_any_column_and_key_names_are_refused_or_every_row_is_sent_its_own_prompt(
    tmp_path_factory: pytest.TempPathFactory,
    client: anthropic.AsyncAnthropic,
    sim: Simulator,
    key: str,
    field: str,
    other: str,
    key_is_text: bool,
) -> None:
    assume(len({key, field, other}) == 3)
    keys = [f"k{i}" for i in range(4)] if key_is_text else list(range(4))
    df = pl.DataFrame({key: keys, field: [f"row {i} says {i * 7}" for i in range(4)], other: ["x"] * 4})
    store = tmp_path_factory.mktemp("names") / "ledger.duckdb"
    template = "Q: {" + field + "}" if field.isidentifier() else "Q: fixed"
    before = len(sim.log())
    try:
        apply_llm(df, "step", prompt=template, key=key, store=store, table="t", client=client, progress=False)
    except LedgerError:
        assert not store.exists() and len(sim.log()) == before, "refused, and nothing written or sent"
        return
    expected = sorted(template.format(**{field: v}) if field.isidentifier() else template for v in df[field])
    assert sorted(e["prompt"] for e in sim.log()[before:]) == sorted(set(expected)), "each row's own prompt, sent"
    with duckdb.connect(str(store), read_only=True) as con:
        stored = con.execute('SELECT step_prompt, step_status FROM "t"').fetchall()
    assert sorted(p for p, _ in stored) == expected and {s for _, s in stored} == {"DONE"}


# -- the survey: one positional scan or one hash join, the same facts --------------------------------------------------
SURVEY_KEYS: dict[str, st.SearchStrategy[Any]] = {
    "int": st.integers(-(2**63), 2**63 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "text": st.text(alphabet="aA é'\"$", max_size=3),
    "float": st.one_of(st.floats(width=64, allow_infinity=True), st.just(float("nan"))),
}


@settings(max_examples=_examples(20))
@given(kind=st.sampled_from(sorted(SURVEY_KEYS)), data=st.data())
def test_the_survey_by_position_says_what_the_join_says(
    tmp_path_factory: pytest.TempPathFactory, client: anthropic.AsyncAnthropic, kind: str, data: st.DataObject
) -> None:
    """A rerun whose frame the table holds first and in order is surveyed by one scan beside it (keys and inputs
    compared in polars for plain types: ints, text; by DuckDB's positional join for others: floats); any other
    frame (shuffled, a subset, a prefix of a much longer table, new rows after, changed texts) falls back to the hash
    join. Whichever is taken, every frame row's facts (status, answer, stale, eligible, changed, exists) are the
    ones the join finds: the scan is an optimisation, never another answer."""
    import llmledger._ledger.survey as survey_module
    from llmledger._ledger.survey import Layout, survey

    keys = data.draw(st.lists(SURVEY_KEYS[kind], min_size=1, max_size=12, unique_by=repr), label="keys")
    keys = list({repr(k): k for k in keys}.values())  # NaN once (repr), -0.0 and 0.0 apart as DuckDB holds them
    assume(kind != "float" or len({0.0 if k == 0 else k for k in keys if k == k}) == sum(1 for k in keys if k == k))
    dtype = {"int": pl.Int64, "int32": pl.Int32, "text": pl.String, "float": pl.Float64}[kind]
    first = pl.DataFrame({"k": pl.Series(keys, dtype=dtype), "text": [f"row {i}" for i in range(len(keys))]})
    more = data.draw(st.integers(0, 2 * len(keys)), label="rows another frame adds after")
    store = tmp_path_factory.mktemp("survey") / "ledger.duckdb"
    common = {"key": "k", "store": store, "table": "t", "client": client, "progress": False}
    apply_llm(first, "s", prompt="{text}", where="false", **common)

    def fresh(n: int, start: int) -> pl.DataFrame:  # rows keyed apart from `keys`
        candidates = (f"{i}!" if kind == "text" else float(i) if kind == "float" else i for i in itertools.count(start))
        values = list(itertools.islice((v for v in candidates if v not in keys), n))
        return pl.DataFrame({"k": pl.Series(values, dtype=dtype), "text": ["more"] * n})

    if more:
        apply_llm(fresh(more, 10**6), "s", prompt="{text}", where="false", **common)
    marks = data.draw(st.lists(st.sampled_from(["NOT_STARTED", "DONE", "STALE", "FAILED"]), min_size=len(keys),
                               max_size=len(keys)), label="statuses")  # fmt: skip
    with duckdb.connect(str(store)) as con:
        con.register("marks", pl.DataFrame({"k": first["k"], "mark": marks}))
        con.execute(
            "UPDATE t SET s = 'answer ' || t.text, s_status = CASE m.mark WHEN 'STALE' THEN 'DONE' ELSE m.mark END, "
            "s_fingerprint = CASE m.mark WHEN 'STALE' THEN uuid() ELSE s_request_fingerprint END, "
            "s_attempts = 1 FROM marks AS m WHERE t.k IS NOT DISTINCT FROM m.k AND m.mark <> 'NOT_STARTED'"
        )
    shape = data.draw(st.sampled_from(["same", "prefix", "after", "shuffled", "subset", "changed"]), label="frame")
    frame = first
    if shape == "prefix":
        frame = first.head(data.draw(st.integers(0, len(keys)), label="prefix"))
    elif shape == "after":  # rows the table holds not
        frame = pl.concat([first, fresh(2, 2 * 10**6)])
    elif shape == "shuffled":
        frame = first.sample(fraction=1.0, shuffle=True, seed=data.draw(st.integers(0, 99), label="seed"))
    elif shape == "subset":
        frame = first.filter(pl.Series(data.draw(st.lists(st.booleans(), min_size=len(keys), max_size=len(keys)))))
    elif shape == "changed":
        at = data.draw(st.integers(0, len(keys) - 1), label="changed row")
        frame = first.with_columns(pl.when(pl.int_range(pl.len()) == at).then(pl.lit("edited")).otherwise("text")
                                   .alias("text"))  # fmt: skip
    layout = Layout("t", "s", ["k"], ["text"])
    with duckdb.connect(str(store), read_only=True) as con:
        version = con.execute("SELECT version FROM llmledger_steps WHERE step = 's'").fetchall()
    params = {"version": version[0][0] if version else "", "max_attempts": 3, "redo": "none",
              "run_started": dt.datetime(2100, 1, 1)}  # fmt: skip
    fields = ("current", "status", "stale", "eligible", "waiting", "in_where", "output", "kept", "kept_flagged")

    def surveyed(**patch: Any) -> pl.DataFrame:
        with duckdb.connect(str(store), read_only=True) as con, pytest.MonkeyPatch.context() as mp:
            for name, value in patch.items():
                mp.setattr(survey_module, name, value)
            return survey(con, layout, frame, fields=fields, params=params)

    scanned: list[bool] = []
    beside = "_positional" if kind == "float" else "_scanned"  # floats: NaN and -0.0 compared by DuckDB
    reads = {name: getattr(survey_module, name) for name in ("_positional", "_scanned")}

    def watched(name: str) -> Any:
        def read(*args: Any, **kwargs: Any) -> Any:
            assert name == beside, f"a {kind} key is read beside the frame by {beside}, not {name}"
            found = reads[name](*args, **kwargs)
            scanned.append(found is not None)
            return found

        return read

    got = surveyed(**{name: watched(name) for name in reads})
    expected = surveyed(_positional=lambda *a, **k: None, _scanned=lambda *a, **k: None)
    assert got.columns == expected.columns and got.height == frame.height
    assert got.to_dicts() == expected.to_dicts() or repr(got.to_dicts()) == repr(expected.to_dicts())
    if shape in ("same", "prefix", "changed"):
        assert scanned == [True], f"a {shape} frame is surveyed by position"
