"""The fast tier: pure unit tests, no server, no subprocess, no store on disk (`pytest tests/unit -n 0`)."""

from hypothesis import settings

# It is about behaviour, not timing (it shares two cores with the rest of the suite), and a failing example must
# come back on a rerun.
UNIT = settings(deadline=None, derandomize=True)
