"""What a client function sees: the run's fixed `Task` and one `Client` (its data, device, batches).

Client work is a module-level function ``fn(client, cstate, msg) -> (reply, new_cstate)``
(docs/architecture.md#client-functions); persistent per-client state round-trips through ``cstate``, never through attributes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from fedray.config import seeding
from fedray.data import ArrayDataset, DataSpec
from fedray.models import TASK, Arch, build_arch, build_model
from fedray.params import Params, get_params, set_params

# A host keeps its clients' splits on a CUDA device up to these fractions of the memory free when it
# keeps the first (`Client._kept_on_device`): 1/4 for training splits, 1/8 for test splits.
KEPT_SHARES = {"train_tensors": 4, "test_tensors": 8}


class ClientError(RuntimeError):
    """A client function raised; carries the client id and the original traceback text.
    ``mistake``: what it raised was a `PluginMistake`, whose message says all (where it happened
    and how to mend it): the command line shows that line, not the traceback."""

    def __init__(self, cid: int, message: str, remote_traceback: str = "", mistake: bool = False) -> None:
        super().__init__(f"client {cid}: {message}")
        self.cid = cid
        self.message = message
        self.remote_traceback = remote_traceback
        self.mistake = mistake

    def __reduce__(self):  # keep the fields when Ray pickles the exception
        return (ClientError, (self.cid, self.message, self.remote_traceback, self.mistake))


class PluginMistake(Exception):
    """Something an algorithm's code (an objective, a client function) did against fedray's rules,
    told in one message that names the code, what it did and the rule."""


def code_name(fn: Any) -> str:
    """A function as a plug-in author finds it: ``module.name (file:line)`` (a partial's function)."""
    while isinstance(fn, partial):
        fn = fn.func
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
    code = getattr(fn, "__code__", None)
    return name if code is None else f"{name} ({code.co_filename}:{code.co_firstlineno})"


def share_device_memory(cache: dict, device: torch.device, hosts: int) -> None:
    """Hosts sharing one device in one process (the runs of a pack, fedray/sweeps/pack.py) each keep
    1/``hosts`` of what a host alone keeps, from the memory free now (``cache``: a host's model
    cache, where `Client._kept_on_device` keeps its budgets)."""
    free = torch.cuda.mem_get_info(device)[0]
    for kind, share in KEPT_SHARES.items():
        cache[(f"{kind}_budget",)] = [free // (share * hosts)]


@dataclass(frozen=True)
class Task:
    """Everything about a run that every client and the coordinator share and never changes."""

    seed: int
    model: str
    spec: DataSpec
    local_epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    participation: float
    eval_batch_size: int
    channels_last: bool = False  # images and convolution weights in channels-last memory format
    eval_train: bool = True  # train_accuracy / train_loss at each evaluation (config key eval_train)
    cuda_deterministic: bool = True  # deterministic CUDA kernels when the clients run on a GPU
    cuda_tf32: bool = True  # cuDNN's TF32 convolutions on an Ampere+ GPU (torch's default)
    head_bias: bool = True  # the model's last layer has a bias (config key head_bias)
    model_init: str = "derived"  # how initial models are seeded (config key model_init)
    weight_init: str = "model"  # model | torch: whose initialisation (config key weight_init)
    batched_clients: str = "auto"  # batched client training: off | on | auto (fedray/engine/batched.py)
    drop_last: bool = False  # every local update drops each epoch's last partial batch (`fedray.experiment.local.drops_last`)
    client_state_memory_mb: float = (
        0.0  # clients' state in memory per host, MB (fedray/federation/client_states.py)
    )
    # the trained model every initial model starts from (config key init_model), loaded once by the
    # coordinator and sent with the task; None: fresh draws
    init_params: Params | None = field(default=None, compare=False, repr=False)

    # the run's id: whose the clients' state files are (`fedray.storage.blobs.owner`)
    run_id: str = field(default="", compare=False)

    def layout(self, x: torch.Tensor) -> torch.Tensor:
        """A batch in the task's memory format (channels-last for images, when asked)."""
        if self.channels_last and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def placed(self, model: nn.Module, device: torch.device) -> nn.Module:
        """``model`` on ``device`` in the task's memory format (it changes only 4-D weights)."""
        if self.channels_last:
            return model.to(device, memory_format=torch.channels_last)
        return model.to(device)

    def init_models(self, k: int) -> dict[int, Params]:
        """K models, model i from its own seeded init (the FedEM/FedRC code: torch seed + i), so the
        components of a mixture or the clusters of IFCA/FedSoft differ; model 0 is FedAvg's init."""
        return {i: get_params(self.build_model(purpose="init" if i == 0 else f"init/{i}")) for i in range(k)}

    def torch_seed(self, purpose: str) -> int:
        """The torch seed a model for ``purpose`` is drawn from: the derived stream (seed, purpose);
        with model_init: seed_plus_k, the initial models ("init", "init/K") from seed + K."""
        if self.model_init == "seed_plus_k" and (purpose == "init" or purpose.startswith("init/")):
            return self.seed + (int(purpose[5:]) if purpose != "init" else 0)
        return seeding.torch_seed(self.seed, purpose)

    def build_model(self, purpose: str = "init", arch: Arch = TASK) -> nn.Module:
        """A freshly initialised model (the task's, or ``arch``); the init draws come from the
        derived stream (seed, purpose), the model's own initialisation's too (weight_init: model,
        `fedray.models.build_model`; the layers an ``arch`` adds, MOON's projection and FedConcat's
        classifier, keep PyTorch's). An initial model ("init", "init/K") of the task's own
        architecture starts from ``init_params`` when the run has them (init_model)."""
        with torch.random.fork_rng(devices=[]):
            # the CPU's generator only (the model is made there): the one forked and put back
            torch.default_generator.manual_seed(self.torch_seed(purpose))
            task_model = partial(
                build_model,
                self.model,
                self.spec.input_shape,
                self.spec.num_classes,
                head_bias=self.head_bias,
                weight_init=self.weight_init,
            )
            model = build_arch(arch, task_model, self.spec.num_classes)
        if (
            self.init_params is not None
            and arch == TASK
            and (purpose == "init" or purpose.startswith("init/"))
        ):
            set_params(model, self.init_params)
        return model

    def rng(
        self, purpose: str, client: int = seeding.GLOBAL, rnd: int = seeding.GLOBAL
    ) -> np.random.Generator:
        return seeding.rng(self.seed, purpose, client, rnd)


class Client:
    """One client's view: its id, its data (views into the shared arrays) and the device to use."""

    def __init__(
        self,
        cid: int,
        task: Task,
        data: ArrayDataset,
        train_idx: np.ndarray,
        test_idx: np.ndarray,
        device: torch.device,
        model_cache: dict | None = None,
    ):
        self.cid = cid
        # Model objects are reused across a host's clients (see `model`): loading params overwrites
        # every entry of the state dict, so reuse changes no number and saves re-initialising. The
        # same host-wide dict holds the values `kept` keeps.
        self._model_cache = {} if model_cache is None else model_cache
        self.task = task
        self.device = device
        self._data = data
        self.train_idx = train_idx
        self.test_idx = test_idx

    @property
    def num_examples(self) -> int:
        return len(self.train_idx)

    @property
    def num_test_examples(self) -> int:
        return len(self.test_idx)

    def label_counts(self) -> np.ndarray:
        return np.bincount(self._data.y[self.train_idx], minlength=self.task.spec.num_classes)

    def model(self, params: Params | None = None, slot: str = "main", arch: Arch = TASK) -> nn.Module:
        """The task's model (or ``arch``) on this client's device, loaded with ``params`` (train mode).

        With ``params`` the module is reused: one per ``slot`` and arch per host, overwritten by the
        next call for the same slot. A client function that needs two models alive at once (MOON's
        global and local model) asks for two slots. Without ``params``: a fresh initialisation.
        """
        if params is None:
            return self.task.placed(self.task.build_model(arch=arch), self.device)
        m = self._model_cache.get((slot, arch))
        if m is None:
            m = self._model_cache[(slot, arch)] = self.task.placed(
                self.task.build_model(arch=arch), self.device
            )
        set_params(m, params)
        m.train()
        return m

    def kept(self, name: str, version: Hashable, make: Callable[[], Any]) -> Any:
        """A value the host keeps across calls (on every client it hosts): ``make()``'s result for
        ``version``, computed on the first call for that version. One version per ``name`` is kept;
        a call with another version computes and keeps that one instead."""
        entry = self._model_cache.get(("kept", name))
        if entry is None or entry[0] != version:
            entry = self._model_cache[("kept", name)] = (version, make())
        return entry[1]

    def train_batches(
        self, rnd: int, epoch: int, batch_size: int | None = None, drop_last: bool = False
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Shuffled mini-batches of the training split; the order is drawn from (seed, loader, client, round, epoch)."""
        for x, y, _ in self.train_batches_at(rnd, epoch, batch_size, drop_last):
            yield x, y

    def train_batches_at(
        self, rnd: int, epoch: int, batch_size: int | None = None, drop_last: bool = False
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray]]:
        """`train_batches` with each batch's positions in the training split (to look up per-sample
        weights). ``drop_last`` drops the last partial batch (FedRC's loaders)."""
        for x, y, pos in self.host_batches(rnd, epoch, batch_size, drop_last):
            yield x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True), pos

    def host_batches(
        self, rnd: int, epoch: int, batch_size: int | None = None, drop_last: bool = False
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor, np.ndarray]]:
        """`train_batches_at`'s batches before they move to the client's device (in host memory):
        batched training (fedray.engine.batched) stacks many clients' batches and moves them at once."""
        bs = batch_size or self.task.batch_size
        positions = self.train_order(rnd, epoch)
        aug = seeding.torch_generator(self.task.seed, f"augment/{epoch}", self.cid, rnd)
        for start in range(0, num_steps(len(positions), bs, drop_last) * bs, bs):
            pos = positions[start : start + bs]
            idx = self.train_idx[pos]
            x = self.task.layout(self.task.spec.to_tensor(self._data.x[idx], augment=True, generator=aug))
            yield x, torch.from_numpy(self._data.y[idx]), pos

    def train_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole training split as host tensors (inputs, labels), in split order, without
        augmentation: the values `host_batches` gives where the data set has none."""
        x = self.task.layout(self.task.spec.to_tensor(self._data.x[self.train_idx]))
        return x, torch.from_numpy(self._data.y[self.train_idx])

    def test_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole test split as host tensors (inputs, labels), in order: the values `test_batches`
        gives, batch by batch."""
        x = self.task.layout(self.task.spec.to_tensor(self._data.x[self.test_idx]))
        return x, torch.from_numpy(self._data.y[self.test_idx])

    def device_train_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`train_tensors` on the client's device. On CUDA they are kept on the device across
        calls (`_kept_on_device`, a quarter of the free memory for the host's training splits), so
        batched training does not convert and move them again every round."""
        kept = None
        if self.device.type == "cuda":
            kept = self._kept_on_device(("train_tensors", self.cid), self.train_idx, self.train_tensors)
        return kept if kept is not None else tuple(t.to(self.device) for t in self.train_tensors())

    def _kept_on_device(
        self,
        key: tuple,
        idx: np.ndarray,
        make: Callable[[], tuple[torch.Tensor, torch.Tensor]],
        share: int = KEPT_SHARES["train_tensors"],
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``make()``'s tensors (inputs and labels of the samples ``idx``) on the device, kept under
        ``key`` across calls while the host's kept copies of their kind (``key[0]``: training or
        test splits) fit 1/``share`` of the device's memory left when the first was kept. None where
        they would not fit: then nothing is made or moved."""
        kept = self._model_cache.get(key)
        if kept is not None:
            return kept
        size = len(idx) * (4 * math.prod(self.task.spec.input_shape) + 8)  # float32 inputs, int64 labels
        budget = self._model_cache.setdefault(
            (f"{key[0]}_budget",), [torch.cuda.mem_get_info(self.device)[0] // share]
        )
        if size > budget[0]:
            return None
        budget[0] -= size
        kept = self._model_cache[key] = tuple(t.to(self.device) for t in make())
        return kept

    def kept_train_tensors(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The copy of the training split `device_train_tensors` keeps on the device, if it keeps one."""
        return self._model_cache.get(("train_tensors", self.cid))

    def _test_key(self) -> tuple:
        """Where the test split's device copy is kept: a client's own, or a global test shard's
        range (every shard is the same client id)."""
        first = int(self.test_idx[0]) if len(self.test_idx) else 0
        return ("test_tensors", self.cid, first, len(self.test_idx))

    def train_order(self, rnd: int, epoch: int) -> np.ndarray:
        """Positions into the training split in this epoch's shuffled order, drawn from (seed,
        loader, client, round, epoch). Batches of anything aligned with the split (precomputed
        features) in this order are the same batches `train_batches` gives."""
        return seeding.rng(self.task.seed, f"loader/{epoch}", self.cid, rnd).permutation(len(self.train_idx))

    def train_labels(self) -> np.ndarray:
        return self._data.y[self.train_idx]

    def test_labels(self) -> np.ndarray:
        return self._data.y[self.test_idx]

    def eval_train_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The training split in order, without augmentation (a model evaluated on its own data).
        Where the split is kept on the device (`device_train_tensors`, on CUDA), its batches are
        slices of that copy: the same values, with no conversion or transfer from the host."""
        kept = self.kept_train_tensors()
        if kept is None:
            yield from iterate(self._data, self.train_idx, self.task, self.device)
        else:
            yield from self._slices(kept)

    def test_batches(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The test split in order (a global test shard's samples, for the shard). On CUDA the split
        is kept on the device (`_kept_on_device`) and its batches are slices of that copy: the same
        values, converted and moved from the host once, not every evaluation."""
        key = self._test_key()
        kept = self._model_cache.get(key)
        if kept is None and self.device.type == "cuda" and len(self.test_idx):
            # their own budget (an eighth of the free memory), so test splits never crowd out the
            # training splits batched training keeps; past it, batch by batch from the host as before
            kept = self._kept_on_device(
                key, self.test_idx, self.test_tensors, share=KEPT_SHARES["test_tensors"]
            )
        if kept is None:
            yield from iterate(self._data, self.test_idx, self.task, self.device)
        else:
            yield from self._slices(kept)

    def _slices(self, kept: tuple[torch.Tensor, torch.Tensor]) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """A split kept on the device in `iterate`'s batches (``eval_batch_size`` at a time)."""
        x, y = kept
        bs = self.task.eval_batch_size
        for start in range(0, len(y), bs):
            yield x[start : start + bs], y[start : start + bs]


def num_steps(samples: int, batch_size: int, drop_last: bool = False) -> int:
    """Mini-batches in one epoch over ``samples``: the last partial batch counts unless ``drop_last``."""
    return samples // batch_size if drop_last else -(-samples // batch_size)


def iterate(
    data: ArrayDataset, idx: np.ndarray, task: Task, device: torch.device
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of ``data[idx]`` in order, without augmentation (evaluation)."""
    for start in range(0, len(idx), task.eval_batch_size):
        sel = idx[start : start + task.eval_batch_size]
        x = task.layout(task.spec.to_tensor(data.x[sel]))
        yield x.to(device, non_blocking=True), torch.from_numpy(data.y[sel]).to(device, non_blocking=True)
