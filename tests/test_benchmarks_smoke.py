"""Keeps tests/benchmarks/bench.py working: each measurement once, small, asserting behaviour not speed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from .benchmarks import bench


def test_noop_rerun_makes_no_calls(tmp_path: Path) -> None:
    result = bench.noop_rerun(5_000, tmp_path)
    assert result["calls"] == 0 and result["stale"] == 0 and result["skipped"] == 5_000


def test_structured_noop_rerun_makes_no_calls(tmp_path: Path) -> None:
    result = bench.structured_overhead(1_000, tmp_path, repeat=1)
    assert result["calls"] == 0 and result["structured_noop_s"] > 0


def test_pacing_keeps_429s_rare(tmp_path: Path) -> None:
    result = bench.throughput(60, 40.0, 0.05, tmp_path)
    assert result["share_429"] < 0.05, result


def test_pacing_under_an_output_token_limit_keeps_429s_rare(tmp_path: Path) -> None:
    result = bench.token_throughput(80, output_tpm=60_000, rpm=None, latency=0.05, folder=tmp_path, burst=2.0)
    assert result["share_429"] < 0.05 and result["requests"] >= 80, result


def test_kill_9_repays_only_what_was_in_flight(tmp_path: Path) -> None:
    result = bench.kill9(240, tmp_path, concurrency=8, latency=0.05)
    assert result["repaid"] <= result["in_flight_at_kill"] <= 8, result
    assert (
        result["journaled_not_committed"] + result["committed"] + result["in_flight_at_kill"]
        == result["paid_before_kill"]
    )


def test_an_openai_model_is_paced_by_its_headers_and_a_kill_9_repays_only_what_was_in_flight(tmp_path: Path) -> None:
    pytest.importorskip("openai")
    paced = bench.token_throughput(
        80, output_tpm=30_000, rpm=None, latency=0.05, folder=tmp_path, burst=2.0, model=bench.OPENAI_MODEL
    )
    assert paced["share_429"] < 0.05 and paced["requests"] >= 80, paced
    killed = bench.kill9(240, tmp_path, concurrency=8, latency=0.05, model=bench.OPENAI_MODEL)
    assert killed["repaid"] <= killed["in_flight_at_kill"] <= 8, killed


def test_postgres_workers_and_claims_benchmark_runs(pg_server: Any) -> None:
    from .benchmarks import bench_postgres

    scaling = bench_postgres.workers(pg_server, 2, rows=40, limit_rps=1000.0)
    assert scaling["done"] == scaling["paid"] == 40, scaling
    overhead = bench_postgres.claim_commit(pg_server, 3_000, sample=400)
    assert overhead["rows_claimed_and_committed"] == 400, overhead


def test_show_benchmark_runs(tmp_path: Path) -> None:
    from .benchmarks import bench_show

    result = bench_show.show_overhead(3_000, tmp_path)
    assert result["failed_per_step"] == 30 and result["show_s"] > 0
    assert bench_show.live_view_ms()["live_view_ms"] > 0


def test_adaptive_concurrency_benchmark_runs(tmp_path: Path) -> None:
    from .benchmarks import bench_servers

    result = bench_servers.compare(60, tmp_path, server={"capacity": 4, "latency": 0.02}, ceiling=8)
    assert [r["concurrency"] for r in result["fixed"]] == [2, 4, 8]
    assert result["adaptive"]["adaptive"] and result["adaptive"]["max_at_once"] <= 8, result


def test_packing_benchmark_keeps_every_row_its_own_answer(tmp_path: Path, sms: Any) -> None:
    from .benchmarks import bench_packing

    result = bench_packing.faults(60, tmp_path, size=10, share=0.5)
    assert result["rows_holding_another_rows_answer"] == 0 and result["rows_not_done"] == 0, result
    assert result["asked_again_alone"] > 0 and result["rows_add_up_to_packs"], result
    assert bench_packing.tokens(40, tmp_path, size=10)["system"]["input_ratio"] < 0.5


def test_modes_benchmark_prices_flex_at_half_and_fails_no_row(tmp_path: Path) -> None:
    pytest.importorskip("openai", reason="needs the openai extra: pip install -e '.[dev]'")
    from .benchmarks import bench_modes

    result = bench_modes.flex(30, tmp_path, unavailable=0.3)
    assert result["cost_flex_over_online"] == pytest.approx(0.5), result
    assert result["flex"]["failed"] == 0 and result["flex"]["retries"] > 0, result
