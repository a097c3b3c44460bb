"""The trained models of finished runs (``DIR/models/RUN_ID/``) as ready torch modules."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def model_index(out_dir: str | Path, run_id: str) -> dict[str, Any]:
    """What ``DIR/models/RUN_ID/index.json`` lists: each model's kind (global | cluster | personal),
    cluster or client, members, and the network it is."""
    from fedray.storage.export import read_index
    from fedray.storage.results import models_folder

    return read_index(models_folder(out_dir, run_id))


def load_models(
    out_dir: str | Path, run_id: str, names: list[str] | None = None
) -> dict[str, torch.nn.Module]:
    """Every saved model of ``run_id`` (or those named), by name, as torch modules in eval mode:
    ``global`` (FedConcat: the concatenated model), ``cluster-K``, ``client-CID`` (personal)."""
    from fedray.storage.export import load_models as load
    from fedray.storage.results import models_folder

    return load(models_folder(out_dir, run_id), names)


def load_model(out_dir: str | Path, run_id: str, name: str = "global") -> torch.nn.Module:
    """One saved model of ``run_id`` as a torch module in eval mode (default: the global model; a
    clustered run's are ``cluster-K``, a personalised run's ``client-CID``: `model_index` lists them)."""
    return load_models(out_dir, run_id, [name])[name]
