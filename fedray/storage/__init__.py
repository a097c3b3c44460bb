"""What a run leaves on disk, and reads back: files written whole or not at all (`files`), the
run's lock (`lock`), the results tables (`results`: their schemas and what a run's files say of it;
`writer`: metrics and runs as Parquet parts), one object as one file (`blobs`: plain data as
arrays and JSON, never pickled), checkpoints (`checkpoint`: the round folders and their
manifests), the trained models (`export`) and the live loggers that show a run's rounds while it
runs (`loggers`: TensorBoard, MLflow, W&B, a plug-in's).

May import: `fedray.config`, `fedray.data`, `fedray.models`, `fedray.params`, `fedray.records`.
"""
