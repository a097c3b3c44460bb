"""What a run leaves on disk, and reads back: the results tables (`results`: metrics and runs as
Parquet parts, the run's lock, atomic writes), checkpoints (`checkpoint`: plain data as arrays and
JSON, never pickled; the round folders and their manifests) and the trained models (`export`).

May import: `fedray.config`, `fedray.data`, `fedray.models`, `fedray.params`, `fedray.records`.
"""
