"""Client partitions (docs/algorithms/partitions.md#partitions): the registry of partition schemes and their draws, pure
functions of the labels and a numpy Generator.

Every partition the config key ``partition`` can choose is one `PartitionScheme`, declared once
(`register_partition`, the built-ins included): its name, the config keys it reads (their defaults
and bounds are `fedray.config.Config`'s), its draw, how reports name it and the checks it needs.
Config validation, data building, sweeps and `fedray report` read `PARTITIONS`; nothing else lists
partitions. A draw returns a `Partition`: per-client index arrays into the training set and, where
the partition has a ground-truth client grouping (``dominant``, ``rotation``), the group id of each
client. NIID-Bench's procedures are followed step by step; the random draws come from the Generator
we pass, so the partitions are reproducible for a seed but not bit-identical to NIID-Bench's own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from string import Formatter
from typing import TYPE_CHECKING, Any

import numpy as np

from fedray.config.coercion import ConfigError
from fedray.config.keys import FIELDS, field_default

if TYPE_CHECKING:
    from fedray.config.sections import DataSection
    from fedray.data.datasets import DatasetInfo

MAX_ATTEMPTS = 1000  # redraws for the min-size rules before we give up with a clear error


class PartitionError(ValueError):
    """The partition cannot be built with these settings; the message names the config key."""


@dataclass(frozen=True)
class PartitionParams:
    """What a draw is given: the number of clients and classes, and the config keys its scheme
    declares (``p["partition_beta"]``), nothing else."""

    num_clients: int
    num_classes: int
    values: Mapping[str, Any] = field(default_factory=dict)  # config key -> value, the scheme's keys
    seed: int = 0  # the run's seed (what "{seed}" in a partition file's path stands for)
    shift: bool = False  # a shift preset applies (a partition file's test-set clients are then dropped)

    def __getitem__(self, key: str) -> Any:
        if key not in self.values:
            raise KeyError(f"a partition draw read config key {key!r}, which its scheme does not declare")
        return self.values[key]


@dataclass
class Partition:
    clients: list[np.ndarray]  # client -> int64 indices into the training set
    groups: np.ndarray | None = None  # client -> ground-truth group, when the partition defines one
    tests: list[np.ndarray] | None = None  # client -> its own test split, when a partition file gives one


Draw = Callable[[np.ndarray, PartitionParams, np.random.Generator], Partition]


@dataclass(frozen=True)
class PartitionScheme:
    """One value of config key ``partition``: how the training set is split across the clients."""

    name: str
    draw: Draw  # (training labels, params, rng) -> Partition
    # The config keys it reads besides num_clients (partition_k, ...): a key another scheme reads
    # and this one does not is refused when the config is built. Defaults and bounds are Config's.
    keys: tuple[str, ...] = ()
    # How `fedray report` names it: a format string over the run's config ("#C={partition_k}"), or
    # a function of the config mapping; "" = the name.
    label: str | Callable[[Mapping[str, Any]], str] = ""
    # (section, dataset info) -> None: what its keys need from the rest of the config (partition_k at
    # most the classes); raises ConfigError naming the key. Optional.
    check: Callable[[DataSection, DatasetInfo], None] | None = None
    grouped: bool = False  # its draws give every client a ground-truth group (`Partition.groups`)
    # (train x, train y, partition, params) -> (x, y, each client's rows): the clients' training
    # data rebuilt after the draw (rotation: each group's images rotated). Optional.
    rebuild: Callable[..., tuple[np.ndarray, np.ndarray, list[np.ndarray]]] | None = None

    def params(
        self, num_clients: int, num_classes: int, seed: int = 0, shift: bool = False, **values: Any
    ) -> PartitionParams:
        """The draw's params: ``values`` for its keys (a key not given takes Config's default)."""
        unknown = sorted(set(values) - set(self.keys))
        if unknown:
            raise KeyError(f"partition {self.name!r} reads {list(self.keys)}, not {unknown}")
        full = {k: values[k] if k in values else field_default(k) for k in self.keys}
        return PartitionParams(num_clients, num_classes, full, seed, shift)

    def params_for(self, section: DataSection, num_classes: int) -> PartitionParams:
        """The draw's params for a run."""
        values = {k: getattr(section, k) for k in self.keys}
        return self.params(section.num_clients, num_classes, section.seed, section.shift != "none", **values)

    @property
    def label_keys(self) -> tuple[str, ...]:
        """The keys its label stands for: those its format string names (a label function: all its keys)."""
        if callable(self.label):
            return self.keys
        return tuple(name for _, name, _, _ in Formatter().parse(self.label) if name)

    def describe(self, config: Mapping[str, Any]) -> str:
        """Its name in reports for the run with ``config`` (a config mapping): #C=2, dirichlet(0.5)."""
        if callable(self.label):
            return self.label(config)
        return self.label.format_map(config) if self.label else self.name


PARTITIONS: dict[str, PartitionScheme] = {}


def register_partition(
    name: str,
    *,
    keys: tuple[str, ...] = (),
    label: str | Callable[[Mapping[str, Any]], str] = "",
    check: Callable[[DataSection, DatasetInfo], None] | None = None,
    grouped: bool = False,
    rebuild: Callable[..., tuple[np.ndarray, np.ndarray, list[np.ndarray]]] | None = None,
) -> Callable[[Draw], Draw]:
    """Decorator: the draw it decorates becomes partition ``name`` (`PartitionScheme` says what each
    argument means), which ``partition: NAME`` then chooses. The draw is returned unchanged."""

    def add(draw: Draw) -> Draw:
        if name in PARTITIONS:
            raise ValueError(f"partition {name!r} is registered already")
        for key in keys:  # its own keys: other partitions refuse them, so no key the rest of fedray reads
            if key not in FIELDS or not key.startswith("partition_"):
                raise ValueError(f"partition {name!r}: {key!r} is not a partition_* config key")
        PARTITIONS[name] = PartitionScheme(name, draw, tuple(keys), label, check, grouped, rebuild)
        return draw

    return add


def readers(
    records: Iterable[Any], keys: Callable[[Any], Iterable[str]] = lambda r: r.keys
) -> dict[str, tuple[str, ...]]:
    """Every config key some of ``records`` (partition schemes, dataset kinds: a ``name`` and the
    ``keys`` only it reads) reads -> the names of those that read it."""
    out: dict[str, list[str]] = {}
    for record in records:
        for key in keys(record):
            out.setdefault(key, []).append(record.name)
    return {k: tuple(v) for k, v in out.items()}


def partition_keys() -> dict[str, tuple[str, ...]]:
    """Every config key some partition reads -> the partitions that read it."""
    return readers(PARTITIONS.values())


def partition_label_keys() -> set[str]:
    """The config keys some partition's report label stands for (runs that differ there are told
    apart by the label; `fedray report` adds no other key for them)."""
    return {key for scheme in PARTITIONS.values() for key in scheme.label_keys}


class _Grouped:
    """The names of the partitions whose draws give ground-truth client groups (a live view)."""

    def __contains__(self, name: object) -> bool:
        return name in PARTITIONS and PARTITIONS[name].grouped  # type: ignore[index]

    def __iter__(self) -> Iterator[str]:
        return iter([n for n, s in PARTITIONS.items() if s.grouped])

    def __repr__(self) -> str:
        return f"GROUPED_PARTITIONS({sorted(self)})"


# Partitions that define ground-truth client groups (`Partition.groups`), e.g. for an oracle clustering.
GROUPED_PARTITIONS = _Grouped()


def _check(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"config key '{key}': {message}")


def _pack(parts: list[list[np.ndarray]] | list[np.ndarray]) -> list[np.ndarray]:
    out = []
    for p in parts:
        if isinstance(p, list):
            p = np.concatenate(p) if p else np.zeros(0, dtype=np.int64)
        out.append(np.asarray(p, dtype=np.int64))
    return out


@register_partition("iid")
def iid(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """docs/algorithms/partitions.md#iid: a random permutation split into N near-equal contiguous parts."""
    return Partition(_pack(np.array_split(rng.permutation(len(labels)), p.num_clients)))


def _check_labels(section: DataSection, info: DatasetInfo) -> None:
    _check(
        1 <= section.partition_k <= info.num_classes,
        "partition_k",
        f"#C=k needs 1 <= k <= {info.num_classes} (classes of {section.dataset}), got {section.partition_k}",
    )


@register_partition("labels", keys=("partition_k",), label="#C={partition_k}", check=_check_labels)
def by_labels(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """docs/algorithms/partitions.md#labels-ck "#C=k": client i holds label i mod C plus k-1 more drawn uniformly; holders of a label split it evenly."""
    n_clients, n_cls, k = p.num_clients, p.num_classes, p["partition_k"]
    parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
    if k == n_cls:
        for c in range(n_cls):
            idx = rng.permutation(np.flatnonzero(labels == c))
            for j, chunk in enumerate(np.array_split(idx, n_clients)):
                parts[j].append(chunk)
        return Partition(_pack(parts))
    holds: list[list[int]] = []
    for i in range(n_clients):
        current = [i % n_cls]
        while len(current) < k:
            c = int(rng.integers(n_cls))
            if c not in current:
                current.append(c)
        holds.append(current)
    for c in range(n_cls):
        holders = [j for j in range(n_clients) if c in holds[j]]
        if not holders:  # only when N < C: nobody holds this label, its samples stay unused
            continue
        idx = rng.permutation(np.flatnonzero(labels == c))
        for j, chunk in zip(holders, np.array_split(idx, len(holders)), strict=True):
            parts[j].append(chunk)
    return Partition(_pack(parts))


@register_partition(
    "dirichlet", keys=("partition_beta", "partition_min_size"), label="dirichlet({partition_beta:g})"
)
def dirichlet(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """docs/algorithms/partitions.md#dirichlet class-wise Dir(beta) with NIID-Bench's balance step; redraw until every client has min_size.

    An attempt only counts each client's samples (the draws are the procedure's, in its order); the
    index lists are put together once an attempt succeeds, so the redraws of a setting that cannot
    succeed (too many clients for the data) end in seconds.
    """
    n, n_clients = len(labels), p.num_clients
    beta, min_size = p["partition_beta"], p["partition_min_size"]
    class_idx = [np.flatnonzero(labels == c) for c in range(p.num_classes)]
    for _ in range(MAX_ATTEMPTS):
        sizes = np.zeros(n_clients, dtype=np.int64)
        drawn = []
        for idx_c in class_idx:
            idx_c = rng.permutation(idx_c)
            props = rng.dirichlet(np.full(n_clients, beta))
            # Balance step: a client that already holds its fair share n/N gets nothing more.
            props = props * (sizes < n / n_clients)
            props = props / props.sum()
            cuts = (np.cumsum(props) * len(idx_c)).astype(int)[:-1]
            sizes += np.diff(np.concatenate([[0], cuts, [len(idx_c)]]))
            drawn.append((idx_c, cuts))
        if sizes.min() >= min_size:
            chunks = [np.split(idx_c, cuts) for idx_c, cuts in drawn]
            parts = [np.concatenate([c[j] for c in chunks]).astype(np.int64) for j in range(n_clients)]
            return Partition([rng.permutation(pj) for pj in parts])
    raise PartitionError(
        f"config key 'partition_beta': Dir({beta}) over {n_clients} clients gave a client with fewer than "
        f"partition_min_size={min_size} samples in {MAX_ATTEMPTS} draws ({n} samples in all); use fewer clients, "
        "a larger partition_beta or a smaller partition_min_size"
    )


@register_partition(
    "quantity", keys=("partition_beta", "partition_min_size"), label="quantity({partition_beta:g})"
)
def quantity(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """docs/algorithms/partitions.md#quantity quantity skew: client sizes ~ Dir(beta), labels IID within each client."""
    n = len(labels)
    beta, min_size = p["partition_beta"], p["partition_min_size"]
    idx = rng.permutation(n)
    for _ in range(MAX_ATTEMPTS):
        q = rng.dirichlet(np.full(p.num_clients, beta))
        if np.min(q * n) >= min_size:
            cuts = (np.cumsum(q) * n).astype(int)[:-1]
            return Partition(_pack(np.split(idx, cuts)))
    raise PartitionError(
        f"config key 'partition_beta': quantity skew Dir({beta}) over {p.num_clients} clients could not give every "
        f"client partition_min_size={min_size} of {n} samples in {MAX_ATTEMPTS} draws"
    )


def _dominant_counts(size: int, beta: float, n_cls: int, dom: int, rng: np.random.Generator) -> np.ndarray:
    """Class counts of one client: round(beta*size) from its dominant class, the rest spread evenly."""
    counts = np.zeros(n_cls, dtype=np.int64)
    counts[dom] = int(round(beta * size))
    rest = size - counts[dom]
    others = np.array([c for c in range(n_cls) if c != dom])
    if len(others):
        counts[others] += rest // len(others)
        extra = rng.choice(others, size=rest % len(others), replace=False)
        counts[extra] += 1
    else:
        counts[dom] = size
    return counts


def _check_clusters(section: DataSection) -> None:
    _check(
        1 <= section.partition_clusters <= section.num_clients,
        "partition_clusters",
        f"must be between 1 and num_clients={section.num_clients}, got {section.partition_clusters}",
    )


def _check_dominant(section: DataSection, info: DatasetInfo) -> None:
    _check(
        section.partition_beta <= 1,
        "partition_beta",
        f"dominant: the dominant-class fraction must be <= 1, got {section.partition_beta}",
    )
    _check_clusters(section)


@register_partition(
    "dominant",
    keys=("partition_beta", "partition_clusters", "partition_size"),
    label="dominant({partition_beta:g},K={partition_clusters})",
    check=_check_dominant,
    grouped=True,
)
def dominant(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """docs/algorithms/partitions.md#dominant dominant-class skew: client i is in group i mod K; each group has its own dominant class."""
    n_cls, n_clients = p.num_classes, p.num_clients
    beta, clusters, size_wanted = p["partition_beta"], p["partition_clusters"], p["partition_size"]
    groups = np.arange(n_clients) % clusters
    dom_of_group = (
        rng.permutation(n_cls)[:clusters] if clusters <= n_cls else rng.integers(0, n_cls, clusters)
    )
    available = np.bincount(labels, minlength=n_cls)

    def demand(size: int) -> np.ndarray:
        # Worst case: every remainder sample lands on the same class (ceil of the even spread).
        need = np.zeros(n_cls, dtype=np.int64)
        for g in groups:
            d = dom_of_group[g]
            per = np.full(n_cls, -(-(size - int(round(beta * size))) // max(1, n_cls - 1)))
            per[d] = int(round(beta * size))
            need += per
        return need

    size = size_wanted or len(labels) // n_clients
    if size_wanted == 0:
        while size > 1 and np.any(demand(size) > available):
            size -= 1
    if size < 1 or np.any(demand(size) > available):
        raise PartitionError(
            f"config key 'partition_size': {size} samples per client with dominant fraction {beta} need more samples "
            f"of some class than the data set has ({available.tolist()}); lower partition_size or num_clients"
        )
    pools = [list(rng.permutation(np.flatnonzero(labels == c))) for c in range(n_cls)]
    parts = []
    for i in range(n_clients):
        counts = _dominant_counts(size, beta, n_cls, int(dom_of_group[groups[i]]), rng)
        chosen = []
        for c in range(n_cls):
            chosen.extend(pools[c][: counts[c]])
            del pools[c][: counts[c]]
        parts.append(rng.permutation(np.asarray(chosen, dtype=np.int64)))
    return Partition(parts, groups=groups.astype(np.int64))


def _check_rotation(section: DataSection, info: DatasetInfo) -> None:
    _check(
        section.shift == "none",
        "shift",
        f"rotation clusters come without a shift preset, got {section.shift!r}",
    )
    _check_clusters(section)


def _rotated(
    x: np.ndarray, y: np.ndarray, part: Partition, p: PartitionParams
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    from fedray.data.rotation import rotated_arrays

    assert part.groups is not None
    return rotated_arrays(x, y, part.clients, part.groups, p["partition_clusters"])


@register_partition(
    "rotation",
    keys=("partition_clusters", "partition_size"),
    check=_check_rotation,
    grouped=True,
    rebuild=_rotated,
)
def rotation(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """docs/algorithms/partitions.md#rotation rotation clusters: an IID split (``size`` > 0: that many samples per client, else all of
    them), client i in group i mod K. The images of group c are rotated by c * 360 / K degrees when
    the data is built (`fedray.data.rotation`); the labels stay."""
    size, clusters = p["partition_size"], p["partition_clusters"]
    order = rng.permutation(len(labels))
    if size:
        if size * p.num_clients > len(order):
            raise PartitionError(
                f"config key 'partition_size': {p.num_clients} clients x {size} samples need more than "
                f"the {len(order)} training samples"
            )
        order = order[: size * p.num_clients]
    return Partition(_pack(np.array_split(order, p.num_clients)), groups=np.arange(p.num_clients) % clusters)


@register_partition(
    "clientwise_dirichlet", keys=("partition_beta",), label="clientwise_dirichlet({partition_beta:g})"
)
def clientwise_dirichlet(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """docs/algorithms/partitions.md#clientwise_dirichlet (Hsu et al. / FedRC "LDA"): client by client, q ~ Dir(beta * remaining class shares), M = n // N draws.

    Drawing one sample at a time from Categorical(q) without replacement, with exhausted classes
    dropped from q, is the same in distribution as a multinomial draw whose overflow is redrawn over
    the classes that still have samples; we do the latter (vectorised).
    """
    n_cls = p.num_classes
    m = len(labels) // p.num_clients
    pools = [list(rng.permutation(np.flatnonzero(labels == c))) for c in range(n_cls)]
    parts = []
    for _ in range(p.num_clients):
        remaining = np.array([len(pl) for pl in pools], dtype=np.float64)
        live = remaining > 0
        q = np.zeros(n_cls)
        q[live] = rng.dirichlet(p["partition_beta"] * remaining[live] / remaining.sum())
        counts = np.zeros(n_cls, dtype=np.int64)
        todo = m
        while todo > 0:
            cap = remaining.astype(np.int64) - counts
            q = np.where(cap > 0, q, 0.0)
            if (
                q.sum() <= 0
                # guard from docs/algorithms/partitions.md#clientwise_dirichlet: the support of q is exhausted;
                # fall back to what is left
            ):
                q = (cap > 0).astype(np.float64)
            draw = rng.multinomial(todo, q / q.sum())
            take = np.minimum(draw, cap)
            counts += take
            todo -= int(take.sum())
        chosen = []
        for c in range(n_cls):
            chosen.extend(pools[c][: counts[c]])
            del pools[c][: counts[c]]
        parts.append(rng.permutation(np.asarray(chosen, dtype=np.int64)))
    return Partition(parts)


def _check_file(section: DataSection, info: DatasetInfo) -> None:
    """The file exists and is a valid partition of this dataset for this many clients (it is small
    next to the data, and reading it now keeps a bad file from failing after Ray has started)."""
    from fedray.data.partition_file import PartitionFileError, read

    _check(bool(section.partition_file), "partition_file", "partition: file needs partition_file: PATH")
    path = section.resolved_partition_file()
    try:
        fp = read(path, shift=section.shift != "none")
    except PartitionFileError as e:
        raise ConfigError(f"config key 'partition_file': {e}") from None
    _check(
        len(fp.train) == section.num_clients,
        "num_clients",
        f"partition file {path!r} holds {len(fp.train)} clients; set num_clients: {len(fp.train)}",
    )
    if info.train_size is not None:
        _check(
            fp.train_size == info.train_size,
            "partition_file",
            f"{path!r} partitions a training set of {fp.train_size} samples, but {section.dataset} has {info.train_size}",
        )
    if fp.dataset is not None:
        _check(
            fp.dataset == section.dataset,
            "partition_file",
            f"{path!r} partitions dataset {fp.dataset!r}, but dataset is {section.dataset!r}",
        )
    if fp.test is not None:
        _check(
            section.client_test_fraction == 0,
            "client_test_fraction",
            f"partition file {path!r} gives each client's test split; set client_test_fraction: 0",
        )
        _check(
            section.shift == "none",
            "shift",
            f"{section.shift} keeps its own test splits (client_test_fraction); partition file {path!r} gives them",
        )


def _file_label(config: Mapping[str, Any]) -> str:
    return config.get("partition_name") or Path(config.get("partition_file", "file")).stem


@register_partition("file", keys=("partition_file", "partition_name"), label=_file_label, check=_check_file)
def from_file(labels: np.ndarray, p: PartitionParams, rng: np.random.Generator) -> Partition:
    """A partition another tool drew (`fedray.data.partition_file`), read from ``partition_file``
    ("{seed}" replaced by the run's seed). The labels and the generator are not used."""
    from fedray.config.keys import partition_file_for
    from fedray.data.partition_file import read

    fp = read(partition_file_for(p["partition_file"], p.seed), shift=p.shift)
    return Partition(fp.train, fp.groups, fp.test)


def split_train_test(
    indices: np.ndarray, fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Keep round(fraction * n) of a client's samples (at least one train sample stays) as its test split."""
    if fraction <= 0:
        return indices, np.zeros(0, dtype=np.int64)
    idx = rng.permutation(indices)
    n_test = min(int(round(fraction * len(idx))), len(idx) - 1)
    return np.sort(idx[n_test:]), np.sort(idx[:n_test])
