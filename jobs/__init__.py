"""Entry points: `fedray` (jobs.cli), `python -m jobs.run`, `python -m jobs.bench`, and experiment configs."""
