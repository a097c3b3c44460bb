"""The trained models of a finished run, on disk (docs/failures-and-checkpoints.md#failures-checkpoints-and-models): ``DIR/models/RUN_ID/``.

::

    models/RUN_ID/
      config.yaml            the resolved config of the run
      index.json             every model: its file, kind (global | cluster | personal), cluster or
                             client, the network it is (Arch), and the task (model name, input shape,
                             number of classes) to build it
      global.npz             parameters: one array per state-dict entry (numpy.load, allow_pickle=False)
      cluster-0.npz ...      clustered algorithms: one per cluster model
      client-000007.npz ...  personal models (FedSoft), where the algorithm keeps them

An algorithm says which models it has with ``models(state, hp) -> list[SavedModel]`` and, if its
clients keep personal models, ``personal_model(cstate) -> Params | None``. `load_models` (and
`analysis.load_model`) build ready torch modules from the folder.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray.models import TASK, Arch
from fedray.params import Params, read_npz

if TYPE_CHECKING:
    import torch


FORMAT = 1


@dataclass
class SavedModel:
    name: str  # file stem: global, cluster-K, client-CID
    params: Params
    kind: str = "global"  # global | cluster | personal
    entity: int = -1  # the cluster (kind cluster) or client (kind personal); -1 for global
    arch: Arch = TASK
    info: dict[str, Any] = field(default_factory=dict)  # e.g. a cluster's member clients


def global_model(params: Params, arch: Arch = TASK) -> list[SavedModel]:
    return [SavedModel("global", params, arch=arch)]


def cluster_models(models: Any, members: dict[int, list[int]] | None = None) -> list[SavedModel]:
    """One model per cluster; ``models`` is a list (cluster = position) or a dict by cluster id."""
    items = models.items() if isinstance(models, dict) else enumerate(models)
    return [
        SavedModel(
            f"cluster-{k}",
            p,
            "cluster",
            int(k),
            info={"members": members[k]} if members and k in members else {},
        )
        for k, p in items
    ]


def members_of(assignment: dict[int, int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for cid, k in sorted(assignment.items()):
        out.setdefault(int(k), []).append(int(cid))
    return out


class ModelShapeError(ValueError):
    """An algorithm's model does not fit the run's model: a parameter missing, extra or of another shape."""


def check_shapes(algorithm: str, models: Iterable[SavedModel], task: Any, when: str) -> None:
    """Every model ``algorithm`` holds (its global and cluster models) against the parameters of a
    fresh model of its architecture: a plug-in's aggregate of the wrong shape is named here, with
    the parameter and both shapes, not at the next evaluation's tensor arithmetic."""
    fresh: dict[Any, dict[str, tuple[int, ...]]] = {}
    for i, m in enumerate(models):
        if not isinstance(m, SavedModel):
            raise TypeError(
                f"algorithm {algorithm!r}: models(state, hp) must return a list of "
                f"fedray.storage.export.SavedModel; item {i} {when} is a {type(m).__name__} "
                "(global_model(params) and cluster_models(models) already return such a list: "
                "return it, not a list holding it)"
            )
        if m.arch not in fresh:
            model = task.build_model("shape-check", m.arch)
            fresh[m.arch] = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        want = fresh[m.arch]
        where = f"algorithm {algorithm!r}: its {m.name} model {when}"
        missing, extra = sorted(set(want) - set(m.params)), sorted(set(m.params) - set(want))
        if missing or extra:
            raise ModelShapeError(f"{where} has parameters missing {missing} and unexpected {extra}")
        for k, shape in want.items():
            got = tuple(np.shape(m.params[k]))
            if got != shape:
                raise ModelShapeError(f"{where} has parameter {k!r} of shape {got}; the model's is {shape}")


def save_models(
    output: str | Path,
    config: Mapping[str, Any],
    alg: Any,
    hp: Any,
    state: Any,
    task: Any,
    client_states: Callable[[], Iterable[tuple[int, Any]]],
) -> Path:
    """Write the run's models to ``output/models/RUN_ID/`` (atomically: aside, then renamed), with
    ``config`` (the run's, as a mapping) beside them; the run is ``task``'s (its id, model and head).
    Personal models (`Algorithm.personal_model`) come from ``client_states()``, every client's state."""
    import yaml

    from fedray.storage.files import fsync_dir, remove_tree, write_text_atomic, writing
    from fedray.storage.results import models_folder

    run_id = task.run_id
    final = models_folder(output, run_id)
    tmp = final.with_name(f".{run_id}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.mkdir(parents=True)
    try:
        models = list(alg.models(state, hp))
        if alg.personal_model is not None:
            for cid, cstate in client_states():
                params = alg.personal_model(cstate)
                if params is not None:
                    models.append(SavedModel(f"client-{cid:06d}", params, "personal", cid))
        index = {
            "format": FORMAT,
            "run_id": run_id,
            "algorithm": config["algorithm"],
            "model": task.model,
            "head_bias": task.head_bias,
            "input_shape": list(task.spec.input_shape),
            "num_classes": task.spec.num_classes,
            "models": {},
        }
        for m in models:
            with writing(tmp / f"{m.name}.npz"), open(tmp / f"{m.name}.npz", "wb") as f:
                np.savez(f, **{k: np.asarray(v) for k, v in m.params.items()})
                f.flush()
                os.fsync(f.fileno())  # on disk before the run is marked finished
            index["models"][m.name] = {
                "file": f"{m.name}.npz",
                "kind": m.kind,
                "entity": m.entity,
                "arch": dataclasses.asdict(m.arch),
                **m.info,
            }
        write_text_atomic(json.dumps(index, indent=1), tmp / "index.json")
        write_text_atomic(yaml.safe_dump(dict(config), sort_keys=False), tmp / "config.yaml")
        if final.exists():
            remove_tree(final, "the run's earlier models")
        os.replace(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


class ModelsMissing(FileNotFoundError):
    pass


def read_index(folder: str | Path) -> dict[str, Any]:
    path = Path(folder) / "index.json"
    if not path.is_file():
        raise ModelsMissing(f"{path}: no saved models (did the run finish, with save_models: true?)")
    index = json.loads(path.read_text())
    if index.get("format") != FORMAT:
        raise ValueError(f"{path}: unknown format {index.get('format')!r}")
    return index


def load_models(folder: str | Path, names: list[str] | None = None) -> dict[str, torch.nn.Module]:
    """Torch modules (in eval mode) for the models saved in ``folder``, by name (all by default)."""
    from functools import partial

    from fedray.models import build_arch, build_model
    from fedray.params import set_params

    folder = Path(folder)
    index = read_index(folder)
    available = index["models"]
    unknown = [n for n in names or [] if n not in available]
    if unknown:
        raise KeyError(f"{folder}: no model {unknown[0]!r}; it has {', '.join(sorted(available))}")
    task_model = partial(
        build_model,
        index["model"],
        tuple(index["input_shape"]),
        index["num_classes"],
        head_bias=index.get("head_bias", True),
    )
    out = {}
    for name in names or sorted(available):
        entry = available[name]
        module = build_arch(Arch(**entry["arch"]), task_model, index["num_classes"])
        with np.load(folder / entry["file"], allow_pickle=False) as npz:
            set_params(module, {k: npz[k] for k in npz.files})
        out[name] = module.eval()
    return out


def initial_params(
    path: str | Path, model: str, head_bias: bool, input_shape: tuple[int, ...], num_classes: int
) -> Params:
    """The parameters of the saved model ``path`` names (config key ``init_model``: a models folder,
    whose global model it is, or one model file in one), checked to be of the task's architecture:
    the same model, inputs and classes, and one array of the right shape for every entry of its
    state dict. Raises ValueError saying what differs."""
    from fedray.config.keys import init_model_file
    from fedray.models import build_model
    from fedray.params import get_params

    given = Path(path)
    file = init_model_file(given)
    if not given.exists():
        raise ValueError(
            f"{given}: no such file or folder (a finished run's DIR/models/RUN_ID/, or a .npz in it)"
        )
    if not file.is_file():
        index = read_index(given)
        raise ValueError(
            f"{given}: has no global model (it holds {', '.join(sorted(index['models']))}); name one of its "
            "files, e.g. cluster-0.npz"
        )
    index = read_index(file.parent)
    entry = next((e for e in index["models"].values() if e["file"] == file.name), None)
    if entry is None:
        raise ValueError(f"{file}: not a model listed in {file.parent / 'index.json'}")
    if entry["arch"] != dataclasses.asdict(TASK):
        raise ValueError(
            f"{file}: a model of another architecture ({entry['arch']}: FedConcat's concatenated model or "
            f"MOON's projection head); start from a model of the task's own architecture"
        )
    saved = (
        index["model"],
        bool(index.get("head_bias", True)),
        tuple(index["input_shape"]),
        index["num_classes"],
    )
    wanted = (model, bool(head_bias), tuple(input_shape), num_classes)
    if saved != wanted:

        def text(m: tuple) -> str:
            return f"{m[0]}{'' if m[1] else ' without head bias'} on {'x'.join(map(str, m[2]))} inputs, {m[3]} classes"

        raise ValueError(
            f"{file}: a model of another architecture ({text(saved)}); this run builds {text(wanted)}"
        )
    params = read_npz(file)
    expect = get_params(build_model(model, tuple(input_shape), num_classes, head_bias=head_bias))
    bad = sorted(set(expect) ^ set(params)) or [k for k in expect if expect[k].shape != params[k].shape]
    if bad:
        raise ValueError(
            f"{file}: its arrays do not fit {model} ({', '.join(bad[:4])}{' ...' if len(bad) > 4 else ''})"
        )
    return params
