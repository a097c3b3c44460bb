"""pandas over fedray's Parquet output (reads files only; no fedray or Ray imports needed)."""

from analysis.load import load_metrics, load_runs
from analysis.plots import accuracy_curves, write_plots
from analysis.report import final_accuracy, report_table

__all__ = ["accuracy_curves", "final_accuracy", "load_metrics", "load_runs", "report_table", "write_plots"]
