"""A seeded fault explorer: real runs (real SDK, the simulator over HTTP, real DuckDB and PostgreSQL) driven through
random interleavings of kills, Ctrl-C, API faults, account stops, database restarts, concurrent runs, skewed
clocks, lost batch creates, commits and claims DuckDB loses, shared step budgets, workers on machines of their own
and flag/reset/redo, over frames whose texts may repeat, then checked against what the simulator billed. (A PID
the system gave to another process is not explored: a scenario cannot make the system reuse one;
`test_edges_claims.py` fakes it.)

    python -m tests.explorer --seed 17                       # replay one scenario
    python -m tests.explorer --seeds 200 --engine both       # explore (prints the figures at the end)

`plan.py` turns a seed into a plan, `actions.py` carries it out, `invariants.py` checks the promise.
"""
