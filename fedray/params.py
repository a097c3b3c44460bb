"""State-dict math on plain numpy dicts (what travels between coordinator and clients).

Parameters cross process boundaries as ``dict[str, np.ndarray]``: Ray serialises numpy arrays
without copying, and the dicts are easy to inspect and test.
"""

from __future__ import annotations

import hashlib
import io
import pickle
import warnings
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

Params = dict[str, np.ndarray]


def read_npz(path: str | Path, keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """The arrays of an .npz file (``keys``: those only), read whole (every member's checksum
    checked, nothing unpickled). A file that is not one, or is damaged or cut short, is a
    ValueError naming it, not the zip or zlib error from deep inside."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return {k: npz[k] for k in (npz.files if keys is None else keys)}
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile, zlib.error) as e:
        raise ValueError(f"{path}: not a readable .npz file ({type(e).__name__}: {e})") from None


def get_params(model: torch.nn.Module) -> Params:
    """A detached CPU copy of the model's full state dict (parameters and buffers)."""
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def set_params(model: torch.nn.Module, params: Mapping[str, np.ndarray]) -> None:
    state = model.state_dict()
    missing = set(state) - set(params)
    unexpected = set(params) - set(state)
    if missing or unexpected:
        raise KeyError(f"parameter names differ: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    with torch.no_grad(), warnings.catch_warnings():
        # Arrays from Ray's object store are read-only; we only read them, so torch's warning is moot.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for k, v in state.items():
            a = np.asarray(params[k])
            if a.shape != tuple(v.shape):
                raise ValueError(f"parameter {k!r} has shape {a.shape}; the model's is {tuple(v.shape)}")
            v.copy_(torch.from_numpy(a))


def weighted_average(
    states: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float],
    like: Mapping[str, np.ndarray] | None = None,
) -> Params:
    """sum_i (w_i / sum_j w_j) * state_i for every entry, in the given order.

    Float entries are accumulated in float64 and cast back to their dtype (or ``like``'s, when the
    states are float64 intermediates); integer entries (e.g. BatchNorm's num_batches_tracked) are
    averaged the same way and rounded. Callers pass states in sorted client order so the result
    does not depend on arrival order.
    """
    if len(states) == 0:
        raise ValueError("weighted_average of no states")
    if len(states) != len(weights):
        raise ValueError(f"{len(states)} states but {len(weights)} weights")
    avg = OrderedAverage(weights, like)
    for s in states:
        avg.add(s)
    return avg.result()


class OrderedAverage:
    """`weighted_average` one state at a time (`Federation.map_fold`): the weights are known up
    front and normalised once, as there, and the states come in the same order, so the result is
    `weighted_average`'s bit for bit, while only one float64 copy of a state is held."""

    def __init__(self, weights: Sequence[float], like: Mapping[str, np.ndarray] | None = None) -> None:
        w = np.asarray(weights, dtype=np.float64)
        if np.any(w < 0) or w.sum() <= 0:
            raise ValueError(f"aggregation weights must be >= 0 with a positive sum, got {w.tolist()}")
        self._w = w / w.sum()
        self._like = like
        self._acc: dict[str, np.ndarray] = {}
        self._dtypes: dict[str, np.dtype] = {}
        self.count = 0

    def add(self, state: Mapping[str, np.ndarray]) -> None:
        if self.count == len(self._w):
            raise ValueError(f"more states than the {len(self._w)} weights")
        wi = self._w[self.count]
        for k in state if not self.count else self._acc:
            if k not in self._acc:
                self._acc[k] = np.zeros(np.shape(state[k]), dtype=np.float64)
                self._dtypes[k] = np.asarray((state if self._like is None else self._like)[k]).dtype
            self._acc[k] += wi * np.asarray(state[k], dtype=np.float64)
        self.count += 1

    def result(self) -> Params:
        if self.count != len(self._w):
            raise ValueError(f"{self.count} states but {len(self._w)} weights")
        return {
            k: (np.rint(acc) if np.issubdtype(self._dtypes[k], np.integer) else acc).astype(self._dtypes[k])
            for k, acc in self._acc.items()
        }


class WeightedSum:
    """A weighted average built one state at a time (`Federation.map_fold`): sum_i w_i * state_i
    and sum_i w_i accumulated in float64, divided once at the end. Holds one float64 copy of a
    state, never the states themselves. The result equals `weighted_average`'s to float64
    rounding (that one divides each weight first), not bit for bit; use one or the other for a
    given algorithm."""

    def __init__(self) -> None:
        self._acc: dict[str, np.ndarray] = {}
        self._dtypes: dict[str, np.dtype] = {}
        self.total = 0.0
        self.count = 0

    def add(self, state: Mapping[str, np.ndarray], weight: float) -> None:
        if weight < 0:
            raise ValueError(f"aggregation weights must be >= 0, got {weight}")
        if self.count and set(state) != set(self._acc):
            raise KeyError(f"parameter names differ: {sorted(set(state) ^ set(self._acc))}")
        for k, v in state.items():
            v = np.asarray(v)
            if k not in self._acc:
                self._acc[k] = np.zeros(v.shape, dtype=np.float64)
                self._dtypes[k] = v.dtype
            self._acc[k] += float(weight) * v.astype(np.float64)
        self.total += float(weight)
        self.count += 1

    def result(self) -> Params:
        if self.total <= 0:
            raise ValueError(f"weighted average of {self.count} states with weight sum {self.total}")
        out: Params = {}
        for k, acc in self._acc.items():
            avg = acc / self.total
            dtype = self._dtypes[k]
            out[k] = (np.rint(avg) if np.issubdtype(dtype, np.integer) else avg).astype(dtype)
        return out


def payload_nbytes(obj: object) -> int:
    """Size of ``obj`` serialised with pickle protocol 5, as Ray ships it.

    Array buffers are counted but not copied: they go out of band through buffer_callback. The
    pickler's memo is off ("fast" mode): with it, a repeated object (the same key string in two
    models) pickles as a back-reference, so the count would depend on which objects happen to be
    shared in the sender's process (not the same in-process and under Ray), not on the content.
    Messages are trees, which fast mode requires.
    """
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5, buffer_callback=buffers.append)
    pickler.fast = True
    pickler.dump(obj)
    return out.getbuffer().nbytes + sum(b.raw().nbytes for b in buffers)


def params_digest(models: Sequence[Mapping[str, np.ndarray]]) -> str:
    """A digest of models' contents (names, dtypes, shapes, values, in order): equal digests, equal
    models. Lets a host keep what it computed from models it will receive again unchanged."""
    h = hashlib.blake2b(digest_size=16)
    for params in models:
        for name, value in params.items():
            a = np.ascontiguousarray(value)
            h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()
