"""The only place that knows DuckDB from PostgreSQL: `duckdb.py` opens a DuckDB file (one read-write process,
held only to claim or commit) and `postgres.py` gives a psycopg 3 connection the same shape."""
