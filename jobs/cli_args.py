"""Arguments several commands take alike (`fedray run`, `sweep`, `tune`): overrides of config keys,
the results folder, plug-ins."""

from __future__ import annotations

import argparse
import json


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
        type=logger_name,
        help="watch the runs live: tensorboard, mlflow, wandb or a plug-in's logger (config key loggers; "
        "repeatable; docs/loggers.md)",
    )


def logger_name(text: str) -> str:
    """``--logger``'s value: a name (an empty one would set no logger, silently)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            "a logger's name: tensorboard, mlflow, wandb or a plug-in's (docs/loggers.md)"
        )
    return text.strip()


def config_sets(args: argparse.Namespace) -> list[str]:
    """The ``--set``s, with ``--logger``s as the list they set (config key loggers), each name
    quoted (a name is never read as YAML)."""
    loggers = getattr(args, "loggers", [])
    return (
        [*args.sets, f"loggers=[{', '.join(json.dumps(n) for n in loggers)}]"] if loggers else list(args.sets)
    )
