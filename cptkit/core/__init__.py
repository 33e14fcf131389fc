"""The framework every step runs on: config composition, the step declaration, ``Job`` (tasks,
markers, manifest), sharded JSONL I/O, records, errors, redaction, progress, sweeps and executors."""
