"""A seeded fault explorer: real runs (real SDK, the simulator over HTTP, real DuckDB and PostgreSQL) driven through
random interleavings of kills, Ctrl-C, API faults, account stops, database restarts, concurrent runs and
flag/reset/redo, then checked against what the simulator billed.

    python -m tests.explorer --seed 17                       # replay one scenario
    python -m tests.explorer --seeds 200 --engine both       # explore (prints the figures at the end)

`plan.py` turns a seed into a plan, `actions.py` carries it out, `invariants.py` checks the promise.
"""
