"""Building a checked `Config` (DESIGN §5): from YAML, ``--set``s or a mapping, every value checked
against the registries (algorithms and their hyperparameters, datasets, partitions, shifts,
models) and every cross-key rule, before any data is read or Ray is started. Errors are
`ConfigError`s that name the key.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fedray.algorithms import ALGORITHMS
from fedray.coercion import ConfigError, coerce, suggest
from fedray.config import FIELDS, NAME_KEYS, SWEEP_KEYS, Config, field_type, merge, parse_sets, read_yaml
from fedray.data import DATASETS, PARTITIONS, dataset_info
from fedray.data.client_files import ClientFilesError, client_paths
from fedray.data.partition_file import PartitionFileError, read
from fedray.data.shift import SHIFTS
from fedray.hparams import check_fields
from fedray.models import MODELS, SELF_NORMALIZING


def load_config(path: str | Path | None = None, sets: Iterable[str] = (), **overrides: Any) -> Config:
    """Read YAML (or the embedded default when ``path`` is None), apply ``--set``s and overrides, validate."""
    raw: dict[str, Any] = read_yaml(path) if path is not None else {}
    raw = merge(raw, parse_sets(sets))
    raw = merge(raw, {k: v for k, v in overrides.items() if v is not None})
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
        values[key] = coerce(key, value, field_type(key), str_from_number=key in NAME_KEYS)
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
        alg = ALGORITHMS.get(values.get("algorithm", Config.algorithm))
        if alg is not None and alg.rounds_from_hp is not None:
            try:
                hp = alg.make_hparams(values.get("hp") or {})
            except (ValueError, ConfigError):
                return  # validate names the bad hp key
            rounds = alg.rounds_from_hp(hp)
            if rounds is not None:
                values["rounds"] = rounds


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
    _choice("algorithm", cfg.algorithm, ALGORITHMS)
    _choice("dataset", cfg.dataset, DATASETS)
    _choice("partition", cfg.partition, [*PARTITIONS, "file"])
    _choice("model", cfg.model, MODELS)
    _choice("shift", cfg.shift, SHIFTS)
    _choice("model_init", cfg.model_init, ("derived", "seed_plus_k"))
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
    if cfg.model in SELF_NORMALIZING:
        mean, std = SELF_NORMALIZING[cfg.model]
        _check(
            not info.normalized,
            "model",
            f"{cfg.model} normalises its inputs itself (mean {mean}, std {std}, as its paper's code), and "
            f"{cfg.dataset} normalises them already (data_root's meta.json has mean and std): they would be "
            "normalised twice; drop the mean and std from meta.json, or pick another model",
        )
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
