"""What a step is, as pure values: its request and fingerprint, its prompt, its output schema, its prices and the
files it attaches. Nothing here opens a store or a connection; every layer above builds on these."""
