"""What the experiment layer builds from a run's config for the layers below, field by field, so
that below it nothing takes the whole config: the `Task` every client and the coordinator share
(`task_for`), the engine a run's clients train with, decided before any data is read
(`engine_for`, from `run_model`), and the in-process federation (`make_local_federation`, `execute`'s factory for
``--local`` and the tests)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from fedray.algorithms import ALGORITHMS
from fedray.config.keys import Config
from fedray.data import DataSpec, FederatedData, dataset_info
from fedray.engine.choice import Engine, choose
from fedray.engine.client import Task
from fedray.federation.client_states import default_budget_mb
from fedray.federation.local import LocalFederation
from fedray.models import build_model
from fedray.storage.export import initial_params


def drops_last(cfg: Config) -> bool:
    """Whether every local update of the run drops each epoch's last partial batch, decided here
    once a run: the config key ``drop_last``, or the algorithm's own ``hp.drop_last`` (the FedRC
    code's loaders: fedavg, ifca, fesem and cfl take it, false by default; fedem and fedrc, true by
    default). The `Task` carries it to every client, the engine applies it to every update
    (`fedray.engine.update.requests`), and the checks before a run read it (`RunPlan.drop_last`, a
    BatchNorm model's last batches)."""
    hp = ALGORITHMS[cfg.algorithm].make_hparams(cfg.hp)
    return cfg.drop_last or bool(getattr(hp, "drop_last", False))


def task_for(cfg: Config, spec: DataSpec) -> Task:
    """The run's Task: its keys, each named; ``init_params`` the model ``init_model`` names (checked
    to be of the task's architecture)."""
    init = (
        initial_params(cfg.init_model, cfg.model, cfg.head_bias, spec.input_shape, spec.num_classes)
        if cfg.init_model
        else None
    )
    return Task(
        seed=cfg.seed,
        model=cfg.model,
        spec=spec,
        local_epochs=cfg.local_epochs,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        momentum=cfg.momentum,
        weight_decay=cfg.weight_decay,
        participation=cfg.participation,
        eval_batch_size=cfg.eval_batch_size,
        channels_last=cfg.channels_last,
        eval_train=cfg.eval_train,
        cuda_deterministic=cfg.cuda_deterministic,
        cuda_tf32=cfg.cuda_tf32,
        head_bias=cfg.head_bias,
        model_init=cfg.model_init,
        weight_init=cfg.weight_init,
        batched_clients=cfg.batched_clients,
        drop_last=drops_last(cfg),
        client_state_memory_mb=cfg.client_state_memory_mb,
        init_params=init,
        run_id=cfg.run_id(),
    )


def run_model(cfg: Config) -> nn.Module:
    """A fresh model of the run's architecture, before any data is read (its inputs and classes
    from the data set's info)."""
    info = dataset_info(cfg.data_section)
    return build_model(cfg.model, tuple(info.input_shape), info.num_classes, head_bias=cfg.head_bias)


def engine_for(cfg: Config, device: str | None = None) -> Engine:
    """`fedray.engine.choice.choose` for a run's config, before any data is read (`run_model`).
    ``device``: where its clients train; by default a GPU where the run may have one (a GPU share,
    or auto, which may resolve to one)."""
    where = device or ("cpu" if cfg.num_gpus_per_actor == 0 else "cuda")
    return choose(cfg.batched_clients, where, lambda: run_model(cfg))


def make_local_federation(
    cfg: Config,
    data: FederatedData,
    device: str = "cpu",
    num_threads: float | None = None,
    packer: Any = None,
    cpus: float | None = None,
) -> tuple[LocalFederation, dict[str, Any]]:
    """The `execute` factory for ``--local``: every client in this process, one at a time, on
    ``device`` (the CPU), with ``num_threads`` torch threads (the config's CPUs per actor).
    ``packer``: the pack the run trains in (`fedray.sweeps.pack`), which its stacked calls go through; the
    worker's memory for client state (``client_state_memory_mb``, or the share of a worker of
    ``cpus`` CPUs, None: alone on the machine) is then shared out between the pack's runs."""
    task = task_for(cfg, data.dataset.spec)
    if packer is not None:
        budget = cfg.client_state_memory_mb or default_budget_mb(cpus)
        task = dataclasses.replace(task, client_state_memory_mb=budget / packer.size)
    fed = LocalFederation(
        task,
        data.dataset.train,
        data.dataset.test,
        data.clients,
        num_threads=cfg.num_cpus_per_actor if num_threads is None else num_threads,
        groups=data.groups,
        test_clients=data.test_clients,
        eval_clients=data.eval_clients,
        device=device,
    )
    placement = {"mode": "local", "actors": 0, "torch_threads": torch.get_num_threads()}
    if packer is not None:
        fed.host.join_pack(packer)
        placement["packed"] = True
    return fed, placement
