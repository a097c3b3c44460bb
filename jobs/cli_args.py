"""Arguments several commands take alike (`fedray run`, `sweep`, `tune`): overrides of config keys,
the results folder, plug-ins."""

from __future__ import annotations

import argparse


def add_config_args(p: argparse.ArgumentParser, set_help: str, plugin_help: str) -> None:
    """``--set KEY=VALUE`` (repeatable), ``--output DIR``, ``--plugin FILE|MODULE`` (repeatable),
    ``--logger NAME`` (repeatable: config key loggers)."""
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    p.add_argument("--output", help="results folder (config key output)")
    p.add_argument(
        "--plugin", dest="plugins", action="append", default=[], metavar="FILE|MODULE", help=plugin_help
    )
    p.add_argument(
        "--logger",
        dest="loggers",
        action="append",
        default=[],
        metavar="NAME",
        help="watch the runs live: tensorboard, mlflow, wandb or a plug-in's logger (config key loggers; "
        "repeatable; docs/loggers.md)",
    )


def config_sets(args: argparse.Namespace) -> list[str]:
    """The ``--set``s, with ``--logger``s as the list they set (config key loggers)."""
    loggers = getattr(args, "loggers", [])
    return [*args.sets, f"loggers=[{', '.join(loggers)}]"] if loggers else list(args.sets)
