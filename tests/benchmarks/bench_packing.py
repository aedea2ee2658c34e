"""Packing rows into one request (`rows_per_request=`), against the offline simulator.
Run: python tests/benchmarks/bench_packing.py [--quick]

(p1) rows per second at a 40 request/s limit, 20 rows to a request, the run alone (apply_llm's call, the store
     made in it; the process start is not in it): target >= 0.9 x 800 rows/s; the same rows unpacked beside it
(p2) billed input tokens per row on the SMS task with a 300-token instruction (as the system prompt, and as the
     prompt template around each message), packed 20 to a request against one to a request: target <= 0.3;
     output tokens per row too (each entry's id and first words cost output tokens), and list price per row
(p3) a run whose stand-in drops, duplicates and swaps ids in a share of its packs: rows holding another row's
     answer (target 0), rows asked again alone, and whether the rows add up to what the packs cost
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anthropic
import duckdb
import polars as pl

from llmledger import Simulator, apply_llm, last_report

SMS = Path(__file__).resolve().parents[3] / "shared" / "data" / "sms_spam.tsv"  # beside the project
LABEL = "Is this SMS spam or ham? Answer spam or ham.\n\n{text}"
# A 300-token instruction, as teams write them: what counts as spam, edge cases, the answer's form.
INSTRUCTION = (
    "You label SMS messages for a telecom's abuse team. A message is spam when it is unsolicited and commercial: "
    "prize and lottery claims, premium-rate numbers and short codes, ringtone and subscription offers, dating and "
    "chat lines, loan and insurance offers, surveys with rewards, and any message asking the reader to call, text "
    "or reply to claim something. A message is ham when it is personal or transactional: friends and family "
    "arranging things, jokes, questions, a bank's or shop's own notice about the reader's account or order, "
    "delivery updates the reader expects, and one-time codes. Slang, abbreviations, typos and missing punctuation "
    "are normal in ham and never a sign of spam by themselves. Words such as free, win or call are spam only when "
    "the message offers something to a stranger; between friends they are ham. A message in another language is "
    "judged the same way. When a message could be either, prefer ham: a false spam label hides a real message "
    "from a customer, which costs more than a missed spam. Answer with exactly one lower-case word, spam or ham, "
    "and nothing else: no punctuation, no explanation, no quotes."
)


def sms(rows: int) -> pl.DataFrame:
    lines = [line.split("\t", 1) for line in SMS.read_text(encoding="utf-8").splitlines() if "\t" in line]
    frame = pl.DataFrame({"truth": [r[0] for r in lines], "text": [r[1] for r in lines]}).unique("text", keep="first")
    return frame.head(rows).with_row_index("id")


def _client(sim: Simulator) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=sim.base_url, api_key="bench", max_retries=0)


def throughput(rows: int, folder: Path, *, rate: float = 40.0, size: int = 20, latency: float = 0.2) -> dict[str, Any]:
    """(p1) Rows per second, packed and unpacked, at the same request limit."""
    frame = pl.DataFrame(
        {"id": range(rows), "text": [f"message number {i}: see you at {i % 24}h" for i in range(rows)]}
    )
    out: dict[str, Any] = {"limit_rps": rate, "rows_per_request": size, "latency_s": latency}
    for name, per, n in (("packed", size, rows), ("unpacked", 1, max(rows // size, 40))):
        with Simulator(latency=latency, rate_limit=rate) as sim:
            t0 = time.perf_counter()
            apply_llm(frame.head(n), "label", prompt=LABEL, client=_client(sim), store=folder / f"tp-{name}.duckdb",
                      table="t", progress=False, rows_per_request=per, concurrency=16)  # fmt: skip
            seconds = time.perf_counter() - t0
            stats = sim.stats()
        out[name] = {
            "rows": n,
            "seconds": round(seconds, 2),
            "rows_per_s": round(n / seconds, 1),
            "requests": stats["requests"],
            "share_429": round(stats["by_status"].get(429, 0) / max(stats["requests"], 1), 4),
        }
    out["packed_share_of_target"] = round(out["packed"]["rows_per_s"] / (0.9 * rate * size), 3)
    return out


def tokens(rows: int, folder: Path, *, size: int = 20) -> dict[str, Any]:
    """(p2) Billed tokens and list price per row, packed against unpacked, with the instruction as the system
    prompt and as the template around each message."""
    frame = sms(rows)
    out: dict[str, Any] = {"rows": frame.height, "rows_per_request": size}
    shapes = {"system": {"system": INSTRUCTION, "prompt": "{text}"}, "template": {"prompt": INSTRUCTION + "\n\n{text}"}}
    for shape, options in shapes.items():
        figures = {}
        for name, per in (("unpacked", 1), ("packed", size)):
            with Simulator() as sim:
                store = folder / f"tok-{shape}-{name}.duckdb"
                apply_llm(frame, "label", client=_client(sim), store=store, table="t", progress=False,
                          rows_per_request=per, cache=False, **options)  # fmt: skip
            with duckdb.connect(str(store), read_only=True) as con:
                (got,) = con.execute(
                    "SELECT sum(label_input_tokens), sum(label_output_tokens), sum(label_cost_usd) FROM t"
                ).fetchall()
            figures[name] = {"input_per_row": got[0] / frame.height, "output_per_row": got[1] / frame.height,
                             "usd_per_1000_rows": got[2] / frame.height * 1000}  # fmt: skip
        out[shape] = {
            **{f"{n}_{k}": round(v, 4) for n, f in figures.items() for k, v in f.items()},
            "input_ratio": round(figures["packed"]["input_per_row"] / figures["unpacked"]["input_per_row"], 3),
            "cost_ratio": round(figures["packed"]["usd_per_1000_rows"] / figures["unpacked"]["usd_per_1000_rows"], 3),
        }
    return out


def faults(rows: int, folder: Path, *, size: int = 20, share: float = 0.3, seed: int = 7) -> dict[str, Any]:
    """(p3) Packs gotten wrong: no row may hold another row's answer."""
    frame = sms(rows)
    with Simulator(seed=seed) as sim:
        client = _client(sim)
        common = {"client": client, "table": "t", "progress": False, "prompt": LABEL}
        alone = apply_llm(frame, "alone", store=folder / "faults.duckdb", **common)
        sim.configure(pack_drop=share, pack_duplicate=share, pack_swap=share, pack_invalid=share)
        sim.reset_stats()
        packed = apply_llm(frame, "packed", store=folder / "faults.duckdb", rows_per_request=size, **common)
        requests = sim.stats()["paid"]
    report = last_report()
    with duckdb.connect(str(folder / "faults.duckdb"), read_only=True) as con:
        ((rows_cost, packs_cost, retried),) = con.execute(
            "SELECT (SELECT sum(packed_cost_usd) FROM t), (SELECT sum(cost_usd) FROM llmledger_packs), "
            "(SELECT count(*) FROM llmledger_packs WHERE rows = 1)"
        ).fetchall()
    wrong = int((packed["packed"] != alone["alone"]).sum())
    return {
        "rows": frame.height,
        "fault_share_each": share,
        "rows_holding_another_rows_answer": wrong,
        "rows_not_done": int((packed["packed_status"] != "DONE").sum()),
        "requests": requests,
        "asked_again_alone": retried,
        "rows_add_up_to_packs": abs(rows_cost - packs_cost) < 1e-9,
        "report_calls": None if report is None else report.calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    if not SMS.exists():
        sys.exit(f"{SMS} is not here (the SMS Spam Collection lives in the shared folder beside the project)")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        results = {
            "p1_throughput": throughput(2_000 if args.quick else 16_000, folder),
            "p2_tokens": tokens(200 if args.quick else 2_000, folder),
            "p3_faults": faults(200 if args.quick else 2_000, folder),
        }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
