"""Choose the tests the lowest-versions pass of .ci/run may leave out, and print them (for .ci/floors.txt).

That pass proves the declared floors: llmledger's code, run on the oldest versions pyproject.toml allows. For that
it needs tests that together run every line of llmledger the whole suite runs there, not every test: the whole
suite twice did not fit CI's 15 minutes on two cores. This reads a coverage run of the whole suite on those
versions with each test's lines apart (its subprocesses' too: CLI verbs, workers, killed runs) and keeps, greedily,
the test that runs the most lines not yet run per second it takes, until every line is run; it prints the others.
Always kept: the fast tier, the ledger's contract suite (the seam both engines must honour, whole) and the
migrations. A test added after the file was made is not in it, so it runs: the pass only leaves out what was shown
to add no line.

Made on the lowest versions (`python3 .ci/lowest.py` gives them), from the repository's root:

    SITE=$(<venv>/bin/python -c "import site; print(site.getsitepackages()[0])")
    echo 'import coverage; coverage.process_startup()' > "$SITE/llmledger_subprocess_coverage.pth"
    COVERAGE_PROCESS_START=.ci/floors.coveragerc COVERAGE_FILE=/tmp/floors/.coverage HYPOTHESIS_PROFILE=floors \\
        LLMLEDGER_TEST_SEEDS=2 LLMLEDGER_EXPLORER_SEEDS=2 <venv>/bin/python -m pytest -m "not jupyter" -q \\
        --ignore=tests/test_benchmarks_smoke.py --ignore=tests/test_docs_examples.py \\
        --cov=llmledger --cov-context=test --cov-report= --durations=0 > /tmp/floors/durations.txt
    <venv>/bin/python .ci/floors.py /tmp/floors/.coverage /tmp/floors/durations.txt > .ci/floors.txt

(pytest-cov and coverage in that venv; `tests/conftest.py` names the running test in LLMLEDGER_TEST_ID, which
.ci/floors.coveragerc makes each subprocess's coverage context.) Make it again when tests or code move much: a
line that only a left-out test runs is not proven on the floors until then.
"""

from __future__ import annotations

import collections
import datetime
import re
import sys

import coverage

ALWAYS = ("tests/unit/", "tests/test_ledger_contract.py", "tests/test_migrations.py")
DURATION = re.compile(r"^([\d.]+)s (?:call|setup|teardown)\s+(\S.*)$")


def lines_by_test(data_file: str) -> dict[str, set[tuple[str, int]]]:
    """Each test's lines of llmledger: its setup, call and teardown in the worker, and its subprocesses'."""
    data = coverage.CoverageData(data_file)
    data.read()
    found: dict[str, set[tuple[str, int]]] = collections.defaultdict(set)
    for path in data.measured_files():
        short = path[path.index("llmledger/") :] if "llmledger/" in path else path
        for line, contexts in data.contexts_by_lineno(path).items():
            for context in contexts:
                if context:  # "" is what runs on import, before any test
                    found[context.split("|")[0]].add((short, line))
    return found


def seconds_by_test(durations_file: str) -> dict[str, float]:
    took: dict[str, float] = collections.defaultdict(float)
    with open(durations_file, encoding="utf-8") as fh:
        for line in fh:
            match = DURATION.match(line.rstrip("\n"))
            if match:
                took[match.group(2)] += float(match.group(1))
    return took


def left_out(found: dict[str, set[tuple[str, int]]], took: dict[str, float]) -> tuple[list[str], dict[str, float]]:
    """The tests to leave out, and figures on what is kept."""
    cost = {t: max(took.get(t, 0.0), 0.05) for t in found}
    kept = {t for t in found if t.startswith(ALWAYS)}
    wanted = set().union(*found.values())
    missing = wanted.difference(*(found[t] for t in kept))
    rest = {t: found[t] for t in found if t not in kept}
    while missing:
        best = max(sorted(rest), key=lambda t: len(rest[t] & missing) / cost[t])
        gained = rest.pop(best) & missing
        if not gained:
            break
        kept.add(best)
        missing -= gained
    # then, dearest first, drop a kept test whose every line another kept test runs too (greedy picks early tests
    # whose lines later picks cover again)
    times = collections.Counter(line for t in kept for line in found[t])
    for test in sorted(kept - {t for t in kept if t.startswith(ALWAYS)}, key=lambda t: -cost[t]):
        if all(times[line] > 1 for line in found[test]):
            kept.discard(test)
            times.subtract(found[test])
    figures = {
        "tests": len(found),
        "kept": len(kept),
        "kept_s": sum(cost[t] for t in kept),
        "all_s": sum(cost.values()),
        "lines": len(wanted),
    }
    return sorted(set(found) - kept), figures


def main(data_file: str, durations_file: str) -> None:
    out, f = left_out(lines_by_test(data_file), seconds_by_test(durations_file))
    print(f"# made {datetime.date.today()} by .ci/floors.py: the tests the lowest-versions pass leaves out.")
    print(f"# The {f['kept']} of {f['tests']} tests it runs take {f['kept_s']:.0f} s of the {f['all_s']:.0f} s all")
    print(f"# took there, and run every one of the {f['lines']:,} lines of llmledger the suite runs.")
    for test in out:
        print(test)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python .ci/floors.py COVERAGE_DATA_FILE DURATIONS_FILE > .ci/floors.txt")
    main(sys.argv[1], sys.argv[2])
