"""Which engine trains a run's clients, per client or stacked, and why: decided here, once, for
every caller. The host that trains asks it (`fedray.federation.host.ClientHost`), and so do the
checks before a run (`batched_clients: on` with a model that cannot stack, `pack_runs: on`),
packing (`pack_runs: auto` packs runs that would train stacked) and the in-process launcher (its
runs train on the CPU).

The config key ``batched_clients``: ``off`` trains one client at a time; ``on`` stacks, and a
model or a client function that cannot be stacked is an error naming it; ``auto`` stacks where the
clients run on a GPU and the model can be stacked, else trains one client at a time.

The settings that let updates share a stack are the config keys declared so (their role ``stack``,
`fedray.config.keys.STACK_KEYS`): the stacked engine keys its stacks by them (`stack_key`) and
packs of runs by them (`fedray.sweeps.pack`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from fedray.config.keys import STACK_KEYS
from fedray.engine import step_options

MODES = ("off", "on", "auto")


def stack_key(task: Any) -> tuple:
    """What the stacked engine reads from its clients' task, but the learning rate: the settings
    of `STACK_KEYS` (config keys that are `fedray.engine.client.Task` fields of the same name) and
    the data's augmentation, which the data set's own keys decide. Updates whose clients' tasks
    differ here (the runs of a pack with different momenta, `fedray.sweeps.pack`)
    train in different stacks."""
    return (*(getattr(task, name) for name in STACK_KEYS), task.spec.augment)


def refusal(model: nn.Module) -> str | None:
    """Why ``model`` cannot train stacked (a layer whose training step mutates buffers or draws
    random numbers), or None."""
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._NormBase) and m.track_running_stats:
            return f"layer {name!r} is {type(m).__name__}, whose running statistics each client updates"
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0:
            return f"layer {name!r} is {type(m).__name__}, whose random masks each client draws"
        if isinstance(m, nn.RNNBase):
            return (
                f"layer {name!r} is {type(m).__name__}, whose steps torch.func.vmap runs one model after "
                "another (no batching rule): stacked, it would train no faster"
            )
    return None


@dataclass(frozen=True)
class Engine:
    """The engine a run's clients train with, and why."""

    stacked: bool
    # batched_clients on: what cannot be stacked (the model, a client function that trains by
    # itself) is an error, not a fallback to one client at a time
    required: bool
    why: str  # the reason, said where the choice is reported or refused
    model_refusal: str | None = None  # why the model cannot train stacked, where that decided it
    # how the stacked step runs (its convolutions, compiled or not, evaluations stacked): the
    # process's options when the engine was decided (`fedray.engine.step_options.use`), carried
    # from there with the decision
    options: step_options.StepOptions = field(default_factory=step_options.current)

    @property
    def name(self) -> str:
        return "stacked" if self.stacked else "per client"


def choose(mode: str, device: str, model: Callable[[], nn.Module]) -> Engine:
    """The engine under ``batched_clients: mode`` for clients on ``device`` ("cpu", "cuda"), with
    the run's ``model()`` (built only where the answer depends on it)."""
    if mode not in MODES:
        raise ValueError(f"batched_clients must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "off":
        return Engine(False, False, "batched_clients is off")
    if mode == "auto" and device != "cuda":
        return Engine(
            False, False, f"on the {device.upper()}, batched_clients auto trains one client at a time"
        )
    why = refusal(model())
    if why is not None:
        return Engine(False, mode == "on", f"the model cannot train stacked: {why}", why)
    return Engine(True, mode == "on", f"batched_clients {mode}" + (" on a GPU" if mode == "auto" else ""))
