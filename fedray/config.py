"""The typed experiment config (DESIGN §5): YAML files plus ``--set key=value`` overrides.

Every key, its default and its meaning is in `Config` below. Unknown keys and bad values raise
`ConfigError` naming the key (and suggesting a close match) before any data is read or Ray is
started. Algorithm hyperparameters live under ``hp.`` and are checked against the chosen
algorithm's ``Hparams`` dataclass.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedray.hparams import bound, check_fields
from fedray.typed import ConfigError, coerce, suggest

__all__ = ["Config", "ConfigError", "from_dict", "load_config", "parse_sets", "validate"]

DEFAULT_FMNIST_ROOT = "/usr/share/datasets/fashion-mnist"
# Names people write unquoted (experiment: 2024, output: 1): a number there means its text.
_NAME_KEYS = ("experiment", "output", "data_root", "partition_file", "partition_name")


# fmt: off
@dataclass
class Config:
    # --- what to run -------------------------------------------------------------------------
    experiment: str = "default"  # free-form name; groups runs in `fedray report`
    algorithm: str = "fedavg"  # a name from fedray.algorithms.ALGORITHMS
    # Algorithm hyperparameters, `hp.<name>`; checked against the chosen algorithm's Hparams. The
    # resolved config keeps those that differ from the algorithm's defaults (the run summary has all).
    hp: dict[str, Any] = field(default_factory=dict)  # e.g. {server_lr: 0.5} for fedavg
    seed: int = field(default=0, metadata=bound(ge=0))  # master seed; every random stream derives from (seed, purpose, client, round)

    # --- data ------------------------------------------------------------------------------------
    # digits | fmnist | mnist | emnist | cifar10 | cifar100 | svhn | synthetic | client_files (one file
    # per client in data_root, fedray/data/client_files.py: the files are the clients, so the
    # partition keys are not used and num_clients must match them)
    dataset: str = "digits"  # the dataset
    # "" = the dataset's default: fmnist -> /usr/share/datasets/fashion-mnist (Debian), others -> ./data
    data_root: str = ""  # folder with the dataset files
    download: bool = False  # let torchvision download a missing dataset into data_root (needs internet)
    emnist_split: str = "byclass"  # EMNIST split: byclass | bymerge | balanced | letters | digits | mnist
    synthetic_size: int = field(default=2000, metadata=bound(ge=10))  # synthetic only: number of training samples (test set is a quarter of it)
    synthetic_shape: list[int] = field(default_factory=lambda: [1, 8, 8])  # synthetic only: [C, H, W] or [D]

    # --- partition across clients (ALGORITHMS.md §7) -------------------------------------------
    num_clients: int = field(default=10, metadata=bound(ge=1))  # N
    # iid | labels (#C=k) | dirichlet | quantity | dominant | clientwise_dirichlet | rotation | file
    partition: str = "dirichlet"  # how training samples are split across clients
    # file: a partition another tool drew (format: fedray/data/partition_file.py; a run's own is in
    # DIR/partitions/RUN_ID.parquet). "{seed}" in the path is replaced by the run's seed.
    partition_file: str = ""  # JSON or Parquet; its content, not its path, goes into the run id
    partition_name: str = ""  # file: how reports name the partition (e.g. "#C=2"); "" = the file's name
    partition_k: int = 2  # labels: classes per client (#C=k)
    partition_beta: float = field(default=0.5, metadata=bound(gt=0))  # Dirichlet concentration; for dominant: the dominant-class fraction
    partition_clusters: int = 4  # dominant / rotation: groups i mod K (own dominant class / c*360/K degrees)
    partition_size: int = field(default=0, metadata=bound(ge=0, note="0 = automatic"))  # dominant / rotation: samples per client (0 = the most the pools allow, <= n/N)
    partition_min_size: int = field(default=10, metadata=bound(ge=1))  # dirichlet/quantity: redraw until every client has this many samples
    client_test_fraction: float = field(default=0.0, metadata=bound(ge=0, lt=1))  # share of each client's samples kept as its test split (FedRC: 0.1)
    # FedRC's shift benchmark on top of the partition (fedray/data/shift.py): corruptions and label
    # maps per client, plus 3 non-participating test clients. A preset keeps 10% of each client's data
    # as its test split (client_test_fraction: 0.1, FedRC's protocol) unless client_test_fraction is set.
    shift: str = "none"  # none | fedrc_paper | fedrc_code

    # --- model and local training (ALGORITHMS.md §0.2) ------------------------------------------------
    # The defaults are the embedded default run (digits, MLP; about 96% in 30 rounds). Paper
    # settings (NIID-Bench/FedConcat: lr 0.01, batch 64, momentum 0.9, 10 epochs) are in jobs/configs/.
    model: str = "mlp"  # a name from fedray.models.MODELS (mlp, simple_cnn, mcmahan_cnn, fedrc_cnn, resnet18, mobilenet_v2, vgg16)
    rounds: int = field(default=30, metadata=bound(ge=1))  # communication rounds
    local_epochs: int = field(default=5, metadata=bound(ge=1))  # full passes over the local data per round
    batch_size: int = field(default=32, metadata=bound(ge=1))  # local mini-batch size (last partial batch kept, as in NIID-Bench)
    lr: float = field(default=0.05, metadata=bound(gt=0))  # local SGD learning rate
    momentum: float = field(default=0.9, metadata=bound(ge=0, lt=1))  # local SGD momentum (optimizer re-created every round)
    weight_decay: float = field(default=1e-5, metadata=bound(ge=0))  # local SGD weight decay
    participation: float = field(default=1.0, metadata=bound(gt=0, le=1))  # fraction of clients sampled per round (first floor(N * p) of a permutation)

    # --- evaluation --------------------------------------------------------------------------------
    eval_every: int = field(default=1, metadata=bound(ge=1))  # evaluate every this many rounds (the last round, and each stage's last, always)
    eval_batch_size: int = field(default=512, metadata=bound(ge=1))  # batch size for evaluation (does not change the numbers)
    # train_accuracy and train_loss at each evaluation: every training client's predictor on its own
    # training split, as many samples as the training set (on 100 FMNIST clients 60,000, three times
    # the global test set). false skips them: `fedray report --at best-train` then has nothing to read.
    eval_train: bool = True  # train_accuracy / train_loss at each evaluation (see above)
    # Images (and convolution weights) in channels-last memory format: 1.35-1.56x faster CNN steps on
    # a CPU thread (jobs/bench.py --memory-format). It changes the float sums, so runs differ in the
    # last bits from false, which is how runs were computed before this key existed.
    channels_last: bool = True  # channels-last memory format for images and convolution weights

    # --- placement (DESIGN §3) -----------------------------------------------------------------------
    num_cpus_per_actor: float = field(default=1.0, metadata=bound(gt=0))  # CPUs reserved per client actor; torch threads = max(1, floor(this))
    num_gpus_per_actor: float = field(default=0.0, metadata=bound(ge=0))  # GPUs per client actor, fractional (e.g. 0.25 puts 4 actors on a GPU)
    num_actors: int = field(default=0, metadata=bound(ge=0, note="0 = from resources"))  # client actors to start; 0 = as many as the cluster's resources allow (at most N)
    placement_timeout_s: float = field(default=300.0, metadata=bound(gt=0))  # give up (loudly) if the actors cannot be placed within this time

    # --- output (DESIGN §6) -------------------------------------------------------------------------
    output: str = "out"  # results folder: metrics/, runs/, configs/, checkpoints/, models/
    save_models: bool = True  # write the trained models to DIR/models/RUN_ID/ when the run finishes

    # --- surviving failures (none of these changes a number, so none is in the run id) ---------------
    # An unfinished run started again goes on from its latest checkpoint (--restart starts over).
    checkpoint_every: int = field(default=10, metadata=bound(ge=0, note="0 = never"))  # checkpoint every this many rounds, and after the last; 0 = never
    keep_checkpoints: int = field(default=1, metadata=bound(ge=1))  # how many of the latest checkpoints DIR/checkpoints/RUN_ID/ keeps
    # Ray runs only: after losing client actors (a node lost, out of memory), new actors on what is
    # left of the cluster go on from the latest checkpoint.
    max_failures: int = field(default=3, metadata=bound(ge=0))  # times a run goes on after such a loss; 0 = fail at the first

    # ------------------------------------------------------------------------------------------------
    # fmt: on

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def run_id(self) -> str:
        """Stable id of the run: the same resolved config gives the same id.

        Keys that cannot change a number are left out (`NOT_IN_RUN_ID`): where results go, and how
        many actors serve the clients (bit-identical for any count, DESIGN §4), which a sweep
        chooses from the resources it has at the time.
        """
        d = self.to_dict()
        for key in NOT_IN_RUN_ID:
            d.pop(key)
        if self.partition_file:  # the clients the file holds, wherever it lies
            from fedray.data.partition_file import digest

            d["partition_file"] = "sha256:" + digest(self.resolved_partition_file())
        for key, default in ADDED_LATER.items():
            if d[key] == default:
                d.pop(key)
        digest = hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:10]
        return f"{self.algorithm}-{self.dataset}-s{self.seed}-{digest}"

    def resolved_partition_file(self) -> str:
        from fedray.data.partition_file import resolve

        return resolve(self.partition_file, self.seed)

    def resolved_data_root(self) -> str:
        if self.data_root:
            return self.data_root
        return DEFAULT_FMNIST_ROOT if self.dataset == "fmnist" else "data"


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(Config)}
NOT_IN_RUN_ID = (
    "output", "num_actors", "placement_timeout_s", "save_models", "checkpoint_every", "keep_checkpoints", "max_failures",
    "partition_name",
)  # fmt: skip
# Keys added after results existed, with the value that means "as before": at that value they stay
# out of the run id, so every earlier run keeps its id (and a re-submitted sweep skips it).
ADDED_LATER = {"shift": "none", "partition_file": "", "channels_last": False, "eval_train": True}
# Keys of a sweep file that are not config keys (fedray/sweep.py expands them into runs).
SWEEP_KEYS = ("grid", "seeds", "cases", "max_concurrent_runs")


# ----------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------


def parse_sets(sets: Iterable[str], flag: str = "--set") -> dict[str, Any]:
    """Turn ``["a=1", "hp.mu=0.1"]`` into a nested dict; values are parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in sets:
        if "=" not in item:
            raise ConfigError(f"{flag} {item!r}: expected key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise ConfigError(f"{flag} {item!r}: empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"{flag} {key}: cannot parse value {raw!r}: {e}") from None
        set_dotted(out, key, value, where=f"{flag} {key}")
    return out


def set_dotted(tree: dict[str, Any], key: str, value: Any, where: str) -> None:
    """``tree["hp"]["mu"] = value`` for ``key="hp.mu"``, making sections as needed (in place)."""
    node = tree
    parts = key.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{where}: '{p}' is not a section")
    node[parts[-1]] = value


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """The inverse of `set_dotted`: ``{"hp": {"mu": 1}}`` -> ``{"hp.mu": 1}`` (an empty section stays)."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, f"{key}."))
        else:
            out[key] = v
    return out


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {e}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r}: expected a mapping of keys to values at the top level")
    return data


def load_config(path: str | Path | None = None, sets: Iterable[str] = (), **overrides: Any) -> Config:
    """Read YAML (or the embedded default when ``path`` is None), apply ``--set``s and overrides, validate."""
    raw: dict[str, Any] = read_yaml(path) if path is not None else {}
    raw = _merge(raw, parse_sets(sets))
    raw = _merge(raw, {k: v for k, v in overrides.items() if v is not None})
    return from_dict(raw)


def from_dict(raw: Mapping[str, Any]) -> Config:
    """Build and validate a Config from a (possibly nested) mapping."""
    for key in SWEEP_KEYS:
        if key in raw:
            raise ConfigError(
                f"key '{key}' belongs to sweeps: run this file with `fedray sweep`, not `fedray run`"
            )
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in FIELDS:
            raise ConfigError(f"unknown config key '{key}'{suggest(key, FIELDS)}")
        values[key] = coerce(key, value, _field_type(key), str_from_number=key in _NAME_KEYS)
    _derive_unset(values)
    cfg = Config(**values)
    validate(cfg)
    return cfg


SHIFT_TEST_FRACTION = 0.1  # FedRC keeps 10% of each client's data as its test split


def _derive_unset(values: dict[str, Any]) -> None:
    """Keys the user left unset that other keys determine (in place): a shift preset's test split,
    and the rounds of an algorithm whose hyperparameters fix them (FedConcat's encoder + classifier
    rounds). A value the user set is never changed; a clash is then `validate`'s error."""
    if values.get("shift", "none") != "none" and "client_test_fraction" not in values:
        values["client_test_fraction"] = SHIFT_TEST_FRACTION
    if "rounds" not in values:
        from fedray.algorithms import ALGORITHMS

        alg = ALGORITHMS.get(values.get("algorithm", Config.algorithm))
        if alg is not None and alg.rounds_from_hp is not None:
            try:
                hp = alg.make_hparams(values.get("hp") or {})
            except (ValueError, ConfigError):
                return  # validate names the bad hp key
            rounds = alg.rounds_from_hp(hp)
            if rounds is not None:
                values["rounds"] = rounds


def _field_type(name: str) -> Any:
    return typing.get_type_hints(Config)[name]


def _choice(key: str, value: str, allowed: Iterable[str]) -> None:
    allowed = sorted(allowed)
    if value not in allowed:
        raise ConfigError(
            f"config key '{key}': unknown value {value!r}{suggest(value, allowed)} (allowed: {', '.join(allowed)})"
        )


def _check(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"config key '{key}': {message}")


def validate(cfg: Config) -> None:
    """Value checks and cross-key checks. Cheap: no data is read, no Ray is started."""
    # Local imports: the registries import torch, which the pure parsing above does not need.
    from fedray.algorithms import ALGORITHMS
    from fedray.data import DATASETS, PARTITIONS, dataset_info
    from fedray.data.shift import SHIFTS
    from fedray.models import MODELS

    _choice("algorithm", cfg.algorithm, ALGORITHMS)
    _choice("dataset", cfg.dataset, DATASETS)
    _choice("partition", cfg.partition, [*PARTITIONS, "file"])
    _choice("model", cfg.model, MODELS)
    _choice("shift", cfg.shift, SHIFTS)
    _choice(
        "emnist_split", cfg.emnist_split, ("byclass", "bymerge", "balanced", "letters", "digits", "mnist")
    )
    try:  # every key's declared bound (field metadata, fedray/hparams.py): one message for all
        check_fields(cfg, prefix="")
    except ValueError as e:
        raise ConfigError(str(e)) from None

    _check(
        cfg.num_gpus_per_actor <= 1 or float(cfg.num_gpus_per_actor).is_integer(),
        "num_gpus_per_actor",
        f"above 1 it must be a whole number of GPUs (Ray's rule), got {cfg.num_gpus_per_actor}",
    )
    _check(
        len(cfg.synthetic_shape) in (1, 3) and all(s >= 1 for s in cfg.synthetic_shape),
        "synthetic_shape",
        f"must be [D] or [C, H, W] with positive sizes, got {cfg.synthetic_shape}",
    )
    _check(bool(cfg.output), "output", "must name a folder")

    try:
        info = dataset_info(cfg)
    except ValueError as e:  # client_files: a missing or bad meta.json
        raise ConfigError(f"config key 'data_root': {e}") from None
    if cfg.dataset == "client_files":
        _check_client_files(cfg)
    if cfg.partition == "file":
        _check_partition_file(cfg, info.train_size)
    else:
        _check(
            not cfg.partition_file,
            "partition_file",
            f"is read only with partition: file (partition is {cfg.partition!r})",
        )
    if cfg.partition == "labels":
        _check(
            1 <= cfg.partition_k <= info.num_classes,
            "partition_k",
            f"#C=k needs 1 <= k <= {info.num_classes} (classes of {cfg.dataset}), got {cfg.partition_k}",
        )
    if cfg.partition == "dominant":
        _check(
            cfg.partition_beta <= 1,
            "partition_beta",
            f"dominant: the dominant-class fraction must be <= 1, got {cfg.partition_beta}",
        )
    if cfg.partition == "rotation":
        _check(
            cfg.shift == "none", "shift", f"rotation clusters come without a shift preset, got {cfg.shift!r}"
        )
    if cfg.partition in ("dominant", "rotation"):
        _check(
            1 <= cfg.partition_clusters <= cfg.num_clients,
            "partition_clusters",
            f"must be between 1 and num_clients={cfg.num_clients}, got {cfg.partition_clusters}",
        )
    if info.train_size is not None:
        _check(
            cfg.num_clients <= info.train_size,
            "num_clients",
            f"{cfg.num_clients} clients but {cfg.dataset} has only {info.train_size} training samples",
        )
    _check(
        cfg.shift == "none" or tuple(info.input_shape) == (1, 28, 28),
        "shift",
        f"{cfg.shift}'s FMNIST-C corruptions need 1x28x28 images (fmnist, mnist, emnist); "
        f"{cfg.dataset} gives {'x'.join(map(str, info.input_shape))}",
    )
    problem = MODELS[cfg.model].incompatibility(info.input_shape)
    if problem:
        raise ConfigError(f"config key 'model': {cfg.model} cannot take {cfg.dataset} inputs: {problem}")

    alg = ALGORITHMS[cfg.algorithm]
    hp = alg.make_hparams(cfg.hp)
    if alg.check_config is not None:
        try:
            alg.check_config(cfg, hp)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    # Canonical hp: the checked, typed values that differ from the algorithm's defaults. Writing a
    # default out (hp.classifier_steps: 3) names the same run as leaving it out, so the run id
    # and the report's settings agree; the full hp is in the run's summary.
    defaults = alg.Hparams()
    cfg.hp = {k: getattr(hp, k) for k in sorted(cfg.hp) if getattr(hp, k) != getattr(defaults, k)}


def _check_client_files(cfg: Config) -> None:
    """The clients are the files: their count is num_clients; nothing else draws or splits them."""
    from fedray.data.client_files import ClientFilesError, client_paths

    try:
        train, _ = client_paths(cfg.resolved_data_root())
    except (ClientFilesError, OSError) as e:
        raise ConfigError(f"config key 'data_root': {e}") from None
    _check(
        cfg.num_clients == len(train),
        "num_clients",
        f"data_root {cfg.resolved_data_root()!r} holds {len(train)} client files; set num_clients: {len(train)}",
    )
    _check(
        cfg.partition != "file",
        "partition",
        "client_files are their own partition; partition: file cannot apply",
    )
    _check(
        cfg.shift == "none",
        "shift",
        "a shift preset builds its own clients; it does not apply to client_files",
    )


def _check_partition_file(cfg: Config, train_size: int | None) -> None:
    """The file exists and is a valid partition of this dataset for this many clients (it is small
    next to the data, and reading it now keeps a bad file from failing after Ray has started)."""
    from fedray.data.partition_file import PartitionFileError, read

    _check(bool(cfg.partition_file), "partition_file", "partition: file needs partition_file: PATH")
    try:
        fp = read(cfg.resolved_partition_file(), shift=cfg.shift != "none")
    except PartitionFileError as e:
        raise ConfigError(f"config key 'partition_file': {e}") from None
    path = cfg.resolved_partition_file()
    _check(
        len(fp.train) == cfg.num_clients,
        "num_clients",
        f"partition file {path!r} holds {len(fp.train)} clients; set num_clients: {len(fp.train)}",
    )
    if train_size is not None:
        _check(
            fp.train_size == train_size,
            "partition_file",
            f"{path!r} partitions a training set of {fp.train_size} samples, but {cfg.dataset} has {train_size}",
        )
    if fp.dataset is not None:
        _check(
            fp.dataset == cfg.dataset,
            "partition_file",
            f"{path!r} partitions dataset {fp.dataset!r}, but dataset is {cfg.dataset!r}",
        )
    if fp.test is not None:
        _check(
            cfg.client_test_fraction == 0,
            "client_test_fraction",
            f"partition file {path!r} gives each client's test split; set client_test_fraction: 0",
        )
        _check(
            cfg.shift == "none",
            "shift",
            f"{cfg.shift} keeps its own test splits (client_test_fraction); partition file {path!r} gives them",
        )


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
