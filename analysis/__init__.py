"""pandas over fedray's Parquet output: reads files only, never starts Ray. It imports fedray's
layout of the results (fedray.storage.results) and, to load trained models, fedray.storage.export; nothing of Ray."""

from analysis.load import (
    layer_gaps,
    load_assignments,
    load_clients,
    load_events,
    load_metrics,
    load_partitions,
    load_runs,
)
from analysis.models import load_model, load_models, model_index
from analysis.plots import accuracy_curves, write_plots
from analysis.report import ReportError, format_table, pivot, run_values, wide_tables

__all__ = [
    "ReportError",
    "accuracy_curves",
    "format_table",
    "model_index",
    "layer_gaps",
    "load_assignments",
    "load_clients",
    "load_partitions",
    "load_events",
    "load_metrics",
    "load_model",
    "load_models",
    "load_runs",
    "pivot",
    "run_values",
    "wide_tables",
    "write_plots",
]
