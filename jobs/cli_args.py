"""Arguments several commands take alike (`fedray run`, `sweep`, `tune`): overrides of config keys,
the results folder, plug-ins."""

from __future__ import annotations

import argparse


def add_config_args(p: argparse.ArgumentParser, set_help: str, plugin_help: str) -> None:
    """``--set KEY=VALUE`` (repeatable), ``--output DIR``, ``--plugin FILE|MODULE`` (repeatable)."""
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    p.add_argument("--output", help="results folder (config key output)")
    p.add_argument(
        "--plugin", dest="plugins", action="append", default=[], metavar="FILE|MODULE", help=plugin_help
    )
