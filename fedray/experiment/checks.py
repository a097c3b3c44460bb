"""Building a checked `Config` (docs/running.md#running-experiments): from YAML, ``--set``s or a mapping, every value checked
against the registries (algorithms and their hyperparameters, datasets, partitions, shifts,
models) and every cross-key rule, before any data is read or Ray is started. Errors are
`ConfigError`s that name the key.

A key that only some partitions read (`PartitionScheme.keys`: partition_k, partition_beta, ...),
or only some datasets (`DatasetKind.keys`: emnist_split, synthetic_size, ...), is refused with a
partition or dataset that does not read it when it is set to another value than its default: it
would change the run id and not one number. At its default it changes neither, so a resolved
config (`Config.to_dict`, every key) and a side file load as they are. A file's key for its own
partition (dataset) gives way when ``--set`` chooses another (it is dropped); in a sweep
(fedray/sweeps/sweep_file.py) a key set for the whole grid counts only for the runs that read it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from fedray.algorithms import ALGORITHMS
from fedray.algorithms.plan import RunPlan
from fedray.config.coercion import ConfigError, coerce, suggest
from fedray.config.hparams import field_problems
from fedray.config.keys import (
    FIELDS,
    MISNAMED,
    MOVED_TO_DATA,
    NAME_KEYS,
    ON_OFF_KEYS,
    REGISTERED,
    RETIRED,
    SWEEP_KEYS,
    Config,
    field_default,
    field_type,
    merge,
    parse_sets,
    read_yaml,
    unsection,
)
from fedray.config.notes import say_once
from fedray.config.plugins import PluginError, activate, describe, origin, resolve
from fedray.data import DATASETS, EVALUATE_ON, PARTITIONS, DatasetInfo, dataset_info, partition_keys
from fedray.data.partitions import readers
from fedray.data.shift import SHIFTS
from fedray.engine.choice import MODES
from fedray.experiment.local import drops_last, engine_for, run_model
from fedray.federation import participants
from fedray.models import MODELS, SELF_NORMALIZING, WEIGHT_INITS
from fedray.storage.export import initial_params
from fedray.storage.loggers import check_loggers


def load_config(
    path: str | Path | None = None,
    sets: Iterable[str] = (),
    plugins: Iterable[str] = (),
    raw: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> Config:
    """Read YAML (or the embedded default when ``path`` is None), apply ``--set``s and overrides, validate.

    The file's ``plugins`` are relative to its folder; ``plugins`` (``--plugin``) are added to them,
    relative to the working directory. ``raw``: the file's keys, read already (a file whose
    ``tune:`` block was taken out)."""
    file: dict[str, Any] = dict(raw) if raw is not None else read_yaml(path) if path is not None else {}
    found: list[str] = []  # what is wrong with the sections, said with the rest (`from_dict`)
    file = unsection(file, f"config file {str(path)!r}" if path is not None else "config", found)
    if path is not None and file.get("plugins"):
        file["plugins"] = resolve_plugins(file["plugins"], Path(path).resolve().parent, f"{path}: plugins")
    if plugins:
        overrides["plugins"] = [*file.get("plugins", []), *resolve_plugins(list(plugins), None, "--plugin")]
    later = merge(*flat_overrides(sets, overrides, found))
    raw = merge(file, later)
    own = unread_keys(file)  # what the file sets that its own partition and dataset do not read
    for key, unread in unread_keys(raw).items():
        if key in later or key in own:
            raise ConfigError(unread.message())
        del raw[key]  # the file's key for its own partition (dataset), which --set replaced
    return from_dict(raw, found)


def flat_overrides(
    sets: Iterable[str], overrides: Mapping[str, Any], found: list[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """What overrides a config, each part flat (a key written with its section or not is one key):
    the ``--set``s, and the keyword overrides that are not None. What is wrong with their sections
    goes into ``found``, for `from_dict` to say with the rest."""
    given = {k: v for k, v in overrides.items() if v is not None}
    return unsection(parse_sets(sets), "--set", found), unsection(given, "overrides", found)


def from_dict(raw: Mapping[str, Any], found: Iterable[str] = ()) -> Config:
    """Build and validate a Config from a (possibly nested) mapping, flat or written in sections.
    ``found``: what is wrong with the sections it was merged from, said with every other problem."""
    found = list(found)
    raw = unsection(raw, "config", found)
    for key in SWEEP_KEYS:
        if key in raw:
            raise ConfigError(f"key '{key}' belongs to sweeps: run it with `fedray sweep`, not `fedray run`")
    if "tune" in raw:
        raise ConfigError("key 'tune' belongs to tuning: run it with `fedray tune`, not `fedray run`")
    values: dict[str, Any] = {}
    moved: dict[str, Any] = {}  # flat keys that moved into the dataset's settings (data.NAME)
    problems = found  # every misplaced, unknown key and wrong type at once
    for key, value in raw.items():
        if key in MOVED_TO_DATA:
            values[key] = moved[key] = value  # for unread_keys; then under data (`_move_to_data`)
            continue
        if key in RETIRED:
            problems.append(f"config key '{key}' is retired: {RETIRED[key]}")
            continue
        if key not in FIELDS:
            problems.append(f"unknown config key '{key}'{key_hint(key, raw.get('algorithm'))}")
            continue
        try:
            on_off = ("on", "off") if key in ON_OFF_KEYS else ()
            values[key] = coerce(
                key, value, field_type(key), str_from_number=key in NAME_KEYS, choices=on_off
            )
        except ConfigError as e:
            several = key == "seed" and isinstance(value, list)
            problems.append(f"{e}; several seeds are a sweep's key seeds: {value}" if several else str(e))
    if problems:
        raise ConfigError.of(
            problems + _names_and_bounds({k: v for k, v in values.items() if k not in moved})
        )
    # Before any name is looked up: plug-ins (named, and installed ones' entry points) add names.
    if values.get("plugins"):
        values["plugins"] = resolve_plugins(values["plugins"], None, "config key 'plugins'")
    try:
        activate(values.get("plugins", []))
    except PluginError as e:
        raise ConfigError(f"config key 'plugins': {e}") from None
    if unread := unread_keys(values):
        raise ConfigError.of([u.message() for u in unread.values()])
    _move_to_data(values, moved)
    _derive_unset(values)
    cfg = Config(**values)
    validate(cfg, given=set(values))
    used = [p for p in plugins_used(cfg) if p not in cfg.plugins]
    return dataclasses.replace(cfg, plugins=[*cfg.plugins, *used]) if used else cfg


def _move_to_data(values: dict[str, Any], moved: Mapping[str, Any]) -> None:
    """Flat keys that moved into the dataset's own settings (`MOVED_TO_DATA`), put there (in place):
    a key its dataset does not read is at its default here (`unread_keys` refused it otherwise) and
    goes; one set to another value is said once, naming the new key."""
    data = dict(values.get("data") or {})
    kind = DATASETS.get(values.get("dataset", field_default("dataset")))
    for key, value in moved.items():
        del values[key]
        new, default = MOVED_TO_DATA[key]
        if kind is None or key not in kind.flat_keys:
            continue
        if new in data and data[new] != value:
            raise ConfigError(
                f"config key '{key}' is 'data.{new}' now, and the two are set to different values"
            )
        data.setdefault(new, value)
        if value != default:
            say_once(f"config key '{key}' is 'data.{new}' now (the dataset's own key); '{key}' still loads")
    if data:
        values["data"] = data


def _names_and_bounds(values: dict[str, Any]) -> list[str]:
    """The unknown names and out-of-bound values among the keys that parsed, for the message that
    names the unknown keys and wrong types: a config is then mended in one go. The keys that did not
    parse are left at their defaults here, so only each key's own checks run (none across keys);
    where the config's plug-ins do not load, their names cannot be told apart from typos: none."""
    try:
        if values.get("plugins"):
            activate(resolve_plugins(values["plugins"], None, "config key 'plugins'"))
        return name_and_bound_problems(Config(**values))
    except Exception:  # noqa: BLE001 - the first message stands as it is
        return []


def resolve_plugins(specs: Any, base: Path | None, where: str) -> list[str]:
    """Plug-in names as a config keeps them (paths absolute, relative to ``base``); `PluginError`s
    as ConfigErrors naming ``where``."""
    if isinstance(specs, str):
        specs = [specs]
    try:
        return [resolve(str(s), base) for s in specs]
    except PluginError as e:
        raise ConfigError(f"{where}: {e}") from None


def plugins_used(cfg: Config) -> list[str]:
    """The plug-ins that registered the run's algorithm, model, dataset and partition (an entry
    point's, or one imported some other way), so the resolved config and the run id name them."""
    modules = [
        ALGORITHMS[cfg.algorithm].module,
        MODELS[cfg.model].build.__module__,
        DATASETS[cfg.dataset].load.__module__,
        PARTITIONS[cfg.partition].draw.__module__,
    ]
    out: list[str] = []
    for m in modules:
        spec = origin(m)
        if spec is None or spec in out:
            continue
        if describe(spec).path is None:  # defined in __main__ (a notebook, a script) or a module with no file
            raise ConfigError(
                f"the run uses what module {m!r} registered, which has no source file fedray can hash into the "
                "run id or send to Ray's workers: put the registration in a .py file and name it under "
                "plugins: (or --plugin, or fedray.run(..., plugins=[...])); docs/extending.md"
            )
        out.append(spec)
    return out


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


@dataclass(frozen=True)
class Unread:
    """A config key that the run's partition (or dataset) does not read."""

    key: str
    what: str  # "partition" | "dataset": the key whose choice does not read it
    chosen: str  # the run's partition (dataset)
    readers: tuple[str, ...]  # the partitions (datasets) that read it
    why: str = ""  # said instead of the readers (a data set that comes with its own clients)

    def message(self, chosen: Iterable[str] = ()) -> str:
        """``config key 'partition_k' is not read by partition 'dirichlet' (it is read by: labels)``;
        ``chosen``: the partitions (datasets) of several runs, where the key reaches several."""
        names = sorted(set(chosen) or {self.chosen})
        plural = "s" if len(names) > 1 else ""
        why = self.why or f"it is read by: {', '.join(self.readers)}"
        return f"config key '{self.key}' is not read by {self.what}{plural} {', '.join(map(repr, names))} ({why})"


def unread_keys(values: Mapping[str, Any], include_defaults: bool = False) -> dict[str, Unread]:
    """The keys of a config mapping (raw or typed) that its partition and dataset do not read, set
    to another value than their default (at its default a key changes no number and no run id: a
    resolved config, or a side file, names every key). An unknown partition or dataset reads
    everything here (its own error comes later). ``include_defaults``: those at their default too."""
    dataset = values.get("dataset", field_default("dataset"))
    partition = values.get("partition", field_default("partition"))
    kind = DATASETS.get(dataset) if isinstance(dataset, str) else None
    scheme = PARTITIONS.get(partition) if isinstance(partition, str) else None
    by_partition, by_dataset = partition_keys(), dataset_keys()
    out: dict[str, Unread] = {}
    for key in values:
        if not include_defaults and (key in FIELDS or key in MOVED_TO_DATA) and at_default(key, values[key]):
            continue
        if kind is not None and kind.own_clients and (key in by_partition or key == "partition"):
            readers = by_partition.get(key, ())
            out[key] = Unread(
                key, "dataset", kind.name, readers, f"{kind.clients_why}: no partition is drawn"
            )
        elif scheme is not None and key in by_partition and key not in scheme.keys:
            out[key] = Unread(key, "partition", scheme.name, by_partition[key])
        elif kind is not None and key in by_dataset and key not in kind.flat_keys:
            out[key] = Unread(key, "dataset", kind.name, by_dataset[key])
    return out


def at_default(key: str, value: Any) -> bool:
    """Whether ``value`` is config key ``key``'s default (a key that moved into data: its old one)."""
    default = MOVED_TO_DATA[key][1] if key in MOVED_TO_DATA else field_default(key)
    try:
        return value == default or (isinstance(default, list) and list(value) == default)
    except TypeError:
        return False


def dataset_keys() -> dict[str, tuple[str, ...]]:
    """Every flat config key some dataset reads on its own (`DatasetKind.flat_keys`: its keys, and
    those that moved into its settings) -> the datasets that read it."""
    return readers(DATASETS.values(), lambda kind: kind.flat_keys)


def key_hint(key: str, algorithm: Any = None) -> str:
    """What an unknown config key may have meant: ``; did you mean 'lr'?`` for learning_rate (a
    name other tools use, `fedray.config.MISNAMED`), ``'hp.mu'`` for mu (a hyperparameter of a
    registered algorithm, the chosen one first), else a close spelling; "" when nothing fits."""
    name = key.strip().lower().replace("-", "_")
    if name.startswith("hp.") and name[3:]:
        return f"; hyperparameters nest under hp: write hp: {{{name[3:]}: ...}} (or --set {name}=...)"
    if name.startswith("data.") and name[5:]:
        return (
            f"; a dataset's own keys nest under data: write data: {{{name[5:]}: ...}} (or --set {name}=...)"
        )
    found: list[str] = []
    if name in FIELDS and name != key:
        found.append(f"'{name}'")
    owners = [n for n, alg in ALGORITHMS.items() if name in {f.name for f in dataclasses.fields(alg.Hparams)}]
    if owners:
        owners.sort(key=lambda n: n != algorithm)
        found.append(f"'hp.{name}' (a hyperparameter of {', '.join(owners)})")
    if name in MISNAMED:
        found.append(f"'{MISNAMED[name]}'")
    if not found:
        return suggest(key, [*FIELDS, *SWEEP_KEYS])  # a sweep file's own keys too (grid, seeds, ...)
    return f"; did you mean {' or '.join(found)}?"


def _choice(key: str, value: str, allowed: Iterable[str]) -> str | None:
    """What is wrong with ``value`` for ``key``, whose values are ``allowed``; None if nothing."""
    allowed = sorted(allowed)
    if value in allowed:
        return None
    hint = ""
    if key in REGISTERED and not suggest(value, allowed):
        article = "an" if key == "algorithm" else "a"
        hint = (
            f"; {article} {key} of your own comes from a plug-in: name its file or module under "
            "plugins: (or --plugin), docs/extending.md"
        )
    return f"config key '{key}': unknown value {value!r}{suggest(value, allowed)} (allowed: {', '.join(allowed)}){hint}"


def _check(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"config key '{key}': {message}")


def name_and_bound_problems(cfg: Config) -> list[str]:
    """Every unknown name (algorithm, data set, partition, model, ...), every value outside its
    key's declared bound (field metadata, fedray/config/hparams.py), and what is wrong with the hp for
    the algorithm (unknown keys, types, bounds): each key's own checks."""
    problems = [
        _choice("algorithm", cfg.algorithm, ALGORITHMS),
        _choice("dataset", cfg.dataset, DATASETS),
        _choice("partition", cfg.partition, PARTITIONS),
        _choice("model", cfg.model, MODELS),
        _choice("shift", cfg.shift, SHIFTS),
        _choice("model_init", cfg.model_init, ("derived", "seed_plus_k")),
        _choice("evaluate_on", cfg.evaluate_on, EVALUATE_ON),
        _choice("weight_init", cfg.weight_init, WEIGHT_INITS),
        _choice("batched_clients", cfg.batched_clients, MODES),
        _choice("pack_runs", cfg.pack_runs, MODES),
        *field_problems(cfg, prefix=""),
    ]
    if cfg.algorithm in ALGORITHMS:
        try:
            ALGORITHMS[cfg.algorithm].make_hparams(cfg.hp)
        except ConfigError as e:
            problems += e.problems
    if cfg.dataset in DATASETS:
        try:
            DATASETS[cfg.dataset].make_settings(cfg.data)
        except ConfigError as e:
            problems += e.problems
    return [p for p in problems if p]


MAX_NAME = 100  # characters of a name that becomes part of a file's name (file systems allow 255)


# the tracking stores MLflow's client writes to ("": a folder, or the default sqlite file in the
# results folder); its database URIs may name a driver (postgresql+psycopg2://)
MLFLOW_SCHEMES = ("", "file", "sqlite", "http", "https", "postgresql", "mysql", "mssql", "databricks")


def _uri_scheme(uri: str) -> str:
    """A URI's scheme without its driver (``postgresql+psycopg2://`` -> postgresql); "" for a path."""
    m = re.match(r"([A-Za-z][A-Za-z0-9.+-]*):", uri)
    if m is None or (len(m.group(1)) == 1 and uri[1:3] in (":\\", ":/")):  # a path, or C:\ on Windows
        return ""
    return m.group(1).split("+")[0].lower()


def validate(cfg: Config, given: Collection[str] | None = None) -> None:
    """Value checks and cross-key checks. Cheap: no Ray is started, and no data is read but what a
    dataset that comes with its clients reads to count them. ``given``: the keys the user set (None:
    all of them); a dataset that comes with its clients counts them where num_clients is not given,
    and clients_per_round sets participation where that is not given."""
    _check(
        bool(cfg.experiment)
        and not re.search(r"[/\\\x00]", cfg.experiment)
        and not cfg.experiment.startswith("."),
        "experiment",
        f"a name, not a path (it names files under the results folder): {cfg.experiment!r}",
    )
    _check(
        cfg.experiment.isprintable(),
        "experiment",
        f"a printable name (a report prints it as it is): {cfg.experiment!r} holds a control character",
    )
    _check(
        len(cfg.experiment) <= MAX_NAME,
        "experiment",
        f"at most {MAX_NAME} characters (it names files under the results folder), got {len(cfg.experiment)}",
    )
    # every name and every key's declared bound (field metadata, fedray/config/hparams.py) at once; the
    # checks below read them, so they come after
    if problems := name_and_bound_problems(cfg):
        raise ConfigError.of(problems)

    _check(
        isinstance(cfg.num_gpus_per_actor, str)
        or cfg.num_gpus_per_actor <= 1
        or float(cfg.num_gpus_per_actor).is_integer(),
        "num_gpus_per_actor",
        f"above 1 it must be a whole number of GPUs (Ray's rule), got {cfg.num_gpus_per_actor}",
    )
    _check(bool(cfg.output), "output", "must name a folder")
    check_loggers(cfg.loggers)  # registered (a plug-in's, imported by now), and their library there
    scheme = _uri_scheme(cfg.mlflow_tracking_uri)
    _check(
        scheme in MLFLOW_SCHEMES,
        "mlflow_tracking_uri",
        f"a tracking store MLflow writes to ({', '.join(s + ':' for s in MLFLOW_SCHEMES if s)} or a folder), "
        f"got {cfg.mlflow_tracking_uri!r}",
    )
    info = _check_data(cfg, given)
    _check_model(cfg, info)
    _check_engine(cfg)
    _check_algorithm(cfg, info)


def _check_data(cfg: Config, given: Collection[str] | None) -> Any:
    """The data set's own keys, its info (without reading it), and the partition and client counts
    against it. Returns the info."""
    kind = DATASETS[cfg.dataset]
    if kind.settings is not None:  # its settings as the values that differ from their defaults (as hp)
        cfg.data = _not_defaults(kind.make_settings(cfg.data), kind.settings(), cfg.data)
    section = cfg.data_section
    if kind.check is not None:  # its own keys (emnist_split, synthetic_shape)
        kind.check(section)
    if given is not None and "num_clients" not in given and kind.count_clients is not None:
        try:  # the clients it makes (LEAF: the users its filters keep)
            cfg.num_clients = kind.count_clients(section)
        except ConfigError:
            raise
        except (ValueError, OSError) as e:  # no client files, no LEAF folder
            raise ConfigError(f"config key 'data_root': {e}") from None
        section = cfg.data_section  # with the count
    try:
        info = dataset_info(section)
    except ConfigError:
        raise
    except ValueError as e:  # client_files: a missing or bad meta.json
        raise ConfigError(f"config key 'data_root': {e}") from None
    _clients_per_round(cfg, given)
    if kind.check_info is not None:  # what needs the data set's info first (client_files: its files)
        kind.check_info(section, info)
    scheme = PARTITIONS[cfg.partition]
    if scheme.check is not None and not kind.own_clients:  # what its keys need from the rest of the config
        scheme.check(section, info)
    if info.train_size is not None:
        _check(
            cfg.num_clients <= info.train_size,
            "num_clients",
            f"{cfg.num_clients} clients but {cfg.dataset} has only {info.train_size} training samples",
        )
    _check(
        cfg.eval_clients <= cfg.num_clients,
        "eval_clients",
        f"{cfg.eval_clients} clients to evaluate on, but the run has {cfg.num_clients} (0 evaluates on every client)",
    )
    _check(
        cfg.evaluate_on != "validation" or cfg.validation_fraction > 0,
        "evaluate_on",
        "validation reads each client's validation split, and validation_fraction is 0: set it (e.g. 0.1)",
    )
    _check(
        cfg.evaluate_on != "validation" or cfg.shift == "none",
        "evaluate_on",
        f"validation cannot stand in for {cfg.shift}'s test clients, which are made of the test set: "
        "evaluate_on: test, or shift: none",
    )
    _check(
        cfg.shift == "none" or tuple(info.input_shape) == (1, 28, 28),
        "shift",
        f"{cfg.shift}'s FMNIST-C corruptions need 1x28x28 images (fmnist, mnist, emnist); "
        f"{cfg.dataset} gives {'x'.join(map(str, info.input_shape))}",
    )
    return info


def _clients_per_round(cfg: Config, given: Collection[str] | None) -> None:
    """clients_per_round N sets participation to N / num_clients (which `participants` turns back
    into N); a participation the user gave beside it must give the same N."""
    n = cfg.clients_per_round
    if not n:
        return
    _check(
        n <= cfg.num_clients,
        "clients_per_round",
        f"{n} clients a round, but the run has {cfg.num_clients} clients",
    )
    if given is None or "participation" in given:
        _check(
            participants(cfg.num_clients, cfg.participation) == n,
            "clients_per_round",
            f"{n} clients a round, and participation {cfg.participation:g} gives "
            f"{participants(cfg.num_clients, cfg.participation)} of {cfg.num_clients}: set one of them",
        )
    cfg.participation = n / cfg.num_clients


def _check_model(cfg: Config, info: Any) -> None:
    """The model takes the data set's inputs (normalised once), and ``init_model`` holds a model
    of this run's architecture."""
    if cfg.model in SELF_NORMALIZING:
        mean, std = SELF_NORMALIZING[cfg.model]
        _check(
            not info.normalized,
            "model",
            f"{cfg.model} normalises its inputs itself (mean {mean}, std {std}, as its paper's code), and "
            f"{cfg.dataset} normalises them already (data_root's meta.json has mean and std): they would be "
            "normalised twice; drop the mean and std from meta.json, or pick another model",
        )
    problem = MODELS[cfg.model].incompatibility(info.input_shape)
    if problem:
        raise ConfigError(f"config key 'model': {cfg.model} cannot take {cfg.dataset} inputs: {problem}")
    if cfg.init_model:
        try:
            initial_params(
                cfg.init_model, cfg.model, cfg.head_bias, tuple(info.input_shape), info.num_classes
            )
        except (ValueError, OSError) as e:
            raise ConfigError(f"config key 'init_model': {e}") from None


def _check_engine(cfg: Config) -> None:
    """What ``on`` asks of the engine (`fedray.engine.choice`) must be possible: ``batched_clients:
    on`` a model that can train stacked; ``pack_runs: on`` stacked training."""
    if "on" not in (cfg.batched_clients, cfg.pack_runs):
        return
    engine = engine_for(cfg)
    if cfg.batched_clients == "on":
        _check(
            engine.stacked,
            "batched_clients",
            f"on: model {cfg.model} cannot train batched: {engine.model_refusal}; use batched_clients: off, "
            "or auto (which trains such a model one client at a time)",
        )
    if cfg.pack_runs == "on":  # a pack trains its runs' clients in one stack
        where = (
            " on the CPU (auto trains one client at a time there)" if cfg.batched_clients == "auto" else ""
        )
        _check(
            engine.stacked or engine.model_refusal is not None,
            "pack_runs",
            f"on stacks the runs' clients together, which needs batched training, and batched_clients "
            f"is {cfg.batched_clients}{where}: set batched_clients: on, or pack_runs: off",
        )
        _check(
            engine.model_refusal is None,
            "pack_runs",
            f"on: model {cfg.model} cannot train batched ({engine.model_refusal}), so its runs cannot be "
            "stacked; use pack_runs: off",
        )


def run_plan(cfg: Config, info: DatasetInfo) -> RunPlan:
    """What an algorithm's check reads of a checked config (`RunPlan`), with the dataset's ``info``."""
    return RunPlan(
        algorithm=cfg.algorithm,
        num_clients=cfg.num_clients,
        participation=cfg.participation,
        rounds=cfg.rounds,
        local_epochs=cfg.local_epochs,
        drop_last=drops_last(cfg),
        partition=cfg.partition,
        partition_clusters=cfg.partition_clusters,
        model=cfg.model,
        head_bias=cfg.head_bias,
        input_shape=tuple(info.input_shape),
        num_classes=info.num_classes,
    )


def _check_algorithm(cfg: Config, info: DatasetInfo) -> None:
    """The algorithm's own checks against the rest of the run; then its hp made canonical: the
    checked, typed values that differ from the algorithm's defaults. Writing a default out
    (hp.classifier_steps: 3) names the same run as leaving it out, so the run id and the report's
    settings agree; the full hp is in the run's summary."""
    alg = ALGORITHMS[cfg.algorithm]
    hp = alg.make_hparams(cfg.hp)
    try:
        if alg.check_run is not None:
            alg.check_run(run_plan(cfg, info), hp)
        if (
            alg.check_config is not None
        ):  # a plug-in's written before check_run (both run where both are given)
            say_once(
                f"algorithm {alg.name} ({alg.module or 'a record'}): check_config(cfg, hp) reads the whole "
                "config and is deprecated; name it check_run(run, hp), which reads fedray.RunPlan "
                "(docs/extending.md#an-algorithm)"
            )
            alg.check_config(cfg, hp)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    cfg.hp = _not_defaults(hp, alg.Hparams(), cfg.hp)


def _not_defaults(made: Any, defaults: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """Of the keys ``given``, the checked and typed values of ``made`` that differ from
    ``defaults``'s: a section (hp, data) as a run id and a report name it, a default written out
    naming the same run as leaving it out."""
    return {k: getattr(made, k) for k in sorted(given) if getattr(made, k) != getattr(defaults, k)}


def check_last_batches(cfg: Config, sizes: Mapping[int, int]) -> None:
    """A model with BatchNorm cannot train on a batch of one sample ("Expected more than 1 value
    per channel when training"): refuse, before anything trains, a run whose clients (``sizes``:
    training samples by client) keep a last batch of one, naming the client and the key."""
    if drops_last(cfg):
        return
    ones = sorted(c for c, n in sizes.items() if n % cfg.batch_size == 1)
    if not ones:
        return
    model = run_model(cfg)
    norms = [n for n, m in model.named_modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if norms:
        c = ones[0]
        raise ConfigError(
            f"config key 'drop_last': model {cfg.model} has BatchNorm ({norms[0]}), which cannot train on "
            f"one sample, and client {c}'s {sizes[c]} training samples leave a last batch of one at "
            f"batch_size {cfg.batch_size} ({len(ones)} client(s) so: {ones[:10]}); set drop_last: true, "
            "or another batch_size"
        )
