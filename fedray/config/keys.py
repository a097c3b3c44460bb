"""The typed experiment config (docs/running.md#running-experiments): YAML files plus ``--set key=value`` overrides.

Every key, its default and its meaning is in `Config` below. Building a Config
(`fedray.experiment.checks.from_dict`, `load_config`) raises `ConfigError` naming the key (and suggesting
a close match) for an unknown key or a bad value, before any data is read or Ray is started.
Algorithm hyperparameters live under ``hp.`` and are checked against the chosen algorithm's
``Hparams`` dataclass.

This module is a leaf: it parses and types keys, and knows no registry. Building a checked Config
(`fedray.experiment.checks.from_dict`, `load_config`) checks the values against the registries of
algorithms, datasets, partitions and models.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fedray.config.coercion import ConfigError
from fedray.config.hparams import bound
from fedray.config.roles import SECTIONS, Role, key, roles_of
from fedray.config.run_ids import file_digest, init_model_file, run_id
from fedray.config.sections import (
    DATA_KEYS,
    DEFAULT_FMNIST_ROOT,
    MOVED_TO_DATA,
    DataSection,
    data_root_for,
    partition_file_for,
)

__all__ = [
    "ADDED_LATER",
    "Config",
    "ConfigError",
    "DEFAULT_FMNIST_ROOT",
    "FIELDS",
    "MISNAMED",
    "MOVED_TO_DATA",
    "RETIRED",
    "NAME_KEYS",
    "NOT_IN_RUN_ID",
    "SWEEP_KEYS",
    "dump_yaml",
    "field_default",
    "field_type",
    "file_digest",
    "flatten",
    "merge",
    "data_root_for",
    "init_model_file",
    "parse_sets",
    "partition_file_for",
    "read_yaml",
    "set_dotted",
]


@dataclass
class Config:
    # --- run: what to run ------------------------------------------------------------
    # free-form name; groups runs in `fedray report`
    experiment: str = key("run", "default", text=True, label=True, tunable=False, trial_differs=True)
    # a name from fedray.algorithms.ALGORITHMS
    algorithm: str = key("run", "fedavg", label=True, registry=True)
    # Modules that register algorithms, models, datasets and partitions (docs/extending.md): a .py
    # file or package folder (relative to the config file naming it) or an importable module name.
    # The resolved config names every plug-in the run uses; the run id, their content.
    # e.g. [my_fedavgm.py]
    plugins: list[str] = key("run", factory=list, as_before=[], pack=True, tunable=False)
    # Algorithm hyperparameters, `hp.<name>`; checked against the chosen algorithm's Hparams. The
    # resolved config keeps those that differ from the algorithm's defaults (the run summary has all).
    hp: dict[str, Any] = key("run", factory=dict)  # e.g. {server_lr: 0.5} for fedavg
    # master seed; every random stream derives from (seed, purpose, client, round)
    seed: int = key("run", 0, rule=bound(ge=0), label=True, setting=False, tunable=False)
    # The seed of what makes the data (fedray/data/__init__.py's data_seed): the partition's draw,
    # each client's test split (and validation split), LEAF's sampling and split, hf's split, FedRC's
    # shift assignments, FedProx's synthetic clients. null = the dataset's default: a dataset that
    # comes with its clients (LEAF, hf, client_files) is read with data seed 0 whatever the run's
    # seed, so seeds vary training only; every other dataset draws its data from `seed`, as before
    # this key existed. A sweep can vary either.
    data_seed: int | None = key(
        "run", None, rule=bound(ge=0, note="null = the dataset's default"), as_before=None, tunable=False
    )

    # --- source: the dataset the samples come from ----------------------------------------
    # A name from fedray.data.DATASETS: digits | fmnist | mnist | emnist | cifar10 | cifar100 | svhn |
    # synthetic | fedprox_synthetic (FedProx's Synthetic(alpha, beta), which comes with its clients) |
    # client_files (one file per client in data_root, fedray/data/client_files.py: the files are the
    # clients, so no partition key may be set and num_clients must match them)
    dataset: str = key("source", "digits", label=True, registry=True, pack=True, tunable=False)  # the dataset
    # "" = the dataset's default: fmnist -> /usr/share/datasets/fashion-mnist (Debian), others -> ./data
    # folder with the dataset files
    data_root: str = key("source", "", text=True, by_content=True, pack=True, tunable=False)
    # let torchvision download a missing dataset into data_root (needs internet)
    download: bool = key("source", False)
    # EMNIST split: byclass | bymerge | balanced | letters | digits | mnist
    emnist_split: str = key("source", "byclass", dataset_own=True, pack=True)
    # synthetic only: number of training samples (test set is a quarter of it)
    synthetic_size: int = key("source", 2000, rule=bound(ge=10), dataset_own=True, pack=True)
    # synthetic only: [C, H, W] or [D]
    synthetic_shape: list[int] = key("source", factory=lambda: [1, 8, 8], dataset_own=True, pack=True)
    # fedprox_synthetic (FedProx's Synthetic(alpha, beta), fedray/data/fedprox_synthetic.py): how far
    # the clients' models (alpha) and their inputs (beta) differ; its clients come with it
    # fedprox_synthetic only: alpha
    synthetic_alpha: float = key("source", 1.0, rule=bound(ge=0), as_before=1.0, dataset_own=True, pack=True)
    # fedprox_synthetic only: beta
    synthetic_beta: float = key("source", 1.0, rule=bound(ge=0), as_before=1.0, dataset_own=True, pack=True)
    # The dataset's own settings (data.NAME), which its DatasetKind declares as a dataclass (as an
    # algorithm declares its hp.*): femnist/shakespeare take LEAF's sampling and split
    # (data.sample_fraction, data.min_samples, data.train_fraction, data.split_seed), hf its dataset
    # and columns (data.name, data.client_column, ...); `fedray docs` lists them for every dataset.
    data: dict[str, Any] = key("source", factory=dict, as_before={}, pack=True)  # the dataset's own settings

    # --- clients: the partition across clients (docs/algorithms/partitions.md#partitions) ------
    # N. A dataset that comes with its clients (LEAF, hf, client_files) counts them itself where this
    # is left out (the clients kept after its filters); a given number that differs is refused.
    num_clients: int = key("clients", 10, rule=bound(ge=1))
    # A name from fedray.data.PARTITIONS (fedray/data/partitions.py: iid, labels (#C=k), dirichlet, ...),
    # where each partition declares the keys below that it reads: setting one it does not read is an error.
    # how training samples are split across clients
    partition: str = key("clients", "dirichlet", label=True, registry=True)
    # file: a partition another tool drew (format: fedray/data/partition_file.py; a run's own is in
    # DIR/partitions/RUN_ID.parquet). "{seed}" in the path is replaced by the run's seed.
    # JSON or Parquet; its content, not its path, goes into the run id
    partition_file: str = key("clients", "", text=True, as_before="", by_content=True)
    # file: how reports name the partition (e.g. "#C=2"); "" = the file's name
    partition_name: str = key("clients", "", text=True, in_run_id=False, setting=False)
    partition_k: int = key("clients", 2)  # labels: classes per client (#C=k)
    # Dirichlet concentration; for dominant: the dominant-class fraction
    partition_beta: float = key("clients", 0.5, rule=bound(gt=0))
    # dominant / rotation: groups i mod K (own dominant class / c*360/K degrees)
    partition_clusters: int = key("clients", 4)
    # dominant / rotation: samples per client (0 = the most the pools allow, <= n/N)
    partition_size: int = key("clients", 0, rule=bound(ge=0, note="0 = automatic"))
    # dirichlet/quantity: redraw until every client has this many samples
    partition_min_size: int = key("clients", 10, rule=bound(ge=1))
    # share of each client's samples kept as its test split (FedRC: 0.1)
    client_test_fraction: float = key("clients", 0.0, rule=bound(ge=0, lt=1))
    # Share of each client's training samples held out as its validation split (docs/tuning.md):
    # round(f n), drawn from the data seed, at most n - 1 (a client keeps a sample to train on; one
    # of a single sample gives none). Its training is on the rest, whatever evaluate_on says.
    validation_fraction: float = key("clients", 0.0, rule=bound(ge=0, lt=1), as_before=0.0, tunable=False)
    # FedRC's shift benchmark on top of the partition (fedray/data/shift.py): corruptions and label
    # maps per client, plus 3 non-participating test clients. A preset keeps 10% of each client's data
    # as its test split (client_test_fraction: 0.1, FedRC's protocol) unless client_test_fraction is set.
    shift: str = key("clients", "none", as_before="none", pack=True)  # none | fedrc_paper | fedrc_code

    # --- training: the model and local training (docs/algorithms/common.md#the-fedavg-core) -----
    # The defaults are the embedded default run (digits, MLP; about 96% in 30 rounds). Paper
    # settings (NIID-Bench/FedConcat: lr 0.01, batch 64, momentum 0.9, 10 epochs) are in jobs/configs/.
    # a name from fedray.models.MODELS (mlp, simple_cnn, mcmahan_cnn, fedrc_cnn, resnet18, mobilenet_v2,
    # vgg16)
    model: str = key("training", "mlp", label=True, registry=True, pack=True)
    # FedConcat's concatenated heads always keep theirs (head_bias: false is refused there).
    # false: the model's last layer has no bias (FedRepo's models: FedRS's reference code)
    head_bias: bool = key("training", True, as_before=True, pack=True)
    # How the initial model(s) are drawn. derived: model k from its own stream of (seed, k), so no two
    # seeds share a model. seed_plus_k: model k right after torch.manual_seed(seed + k), as the
    # FedEM/FedRC code draws its K learners: bit for bit its models, and seeds s and s + 1 then share
    # K - 1 of their K initial models (which narrows the seed-to-seed spread of a K-model method).
    model_init: str = key("training", "derived", as_before="derived")  # derived | seed_plus_k
    # Whose initialisation a fresh model gets. model: its authors' code's, where the model declares one
    # (fedray/models: leaf_cnn and leaf_lstm draw LEAF's TensorFlow 1 defaults: Glorot-uniform conv,
    # dense, embedding and LSTM kernels, an LSTM layer's bound from TF's joint [input + hidden,
    # 4 * hidden] kernel, zero biases but the LSTM forget gate's 1.0 in bias_ih, TF's forget_bias),
    # PyTorch's elsewhere. torch: PyTorch's default for every model. Either way from model_init's draw.
    weight_init: str = key("training", "model", as_before="model")  # model | torch
    # Start from a trained model instead of a fresh draw: a finished run's saved models folder
    # (DIR/models/RUN_ID/: its global model) or one model file in it (global.npz, cluster-2.npz).
    # Every initial model the algorithm draws (the global one, each of K cluster models) starts from it;
    # it must be of the run's architecture (model, inputs, classes). Its content, not its path, goes
    # into the run id. Fine-tuning, continuing a finished run with another algorithm, warm starts.
    # "" = a fresh draw (model_init)
    init_model: str = key("training", "", text=True, as_before="", by_content=True)
    rounds: int = key("training", 30, rule=bound(ge=1), tunable=False)  # communication rounds
    # full passes over the local data per round
    local_epochs: int = key("training", 5, rule=bound(ge=1), stack=True, pack=True)
    # local mini-batch size (the last partial batch kept, as in NIID-Bench, unless drop_last)
    batch_size: int = key("training", 32, rule=bound(ge=1), stack=True, pack=True)
    # Drop each epoch's last partial batch in every client's local training, whatever the algorithm
    # (an algorithm's hp.drop_last does it for that algorithm alone). A model with BatchNorm needs it
    # where a client's last batch would hold one sample (checked before the run).
    drop_last: bool = key("training", False, as_before=False, stack=True, pack=True)
    lr: float = key("training", 0.05, rule=bound(gt=0))  # local SGD learning rate
    # local SGD momentum (optimizer re-created every round)
    momentum: float = key("training", 0.9, rule=bound(ge=0, lt=1), stack=True, pack=True)
    # local SGD weight decay
    weight_decay: float = key("training", 1e-5, rule=bound(ge=0), stack=True, pack=True)
    # fraction of clients sampled per round (first floor(N * p) of a permutation)
    participation: float = key("training", 1.0, rule=bound(gt=0, le=1))
    # Clients a round as a number (LEAF's and FedScale's settings: 3 writers a round), exclusive with
    # participation, which it sets to clients_per_round / num_clients. 0 = participation decides.
    clients_per_round: int = key(
        "training", 0, rule=bound(ge=0, note="0 = participation"), in_run_id=False, setting=False
    )

    # --- evaluation --------------------------------------------------------------------------------
    # What the evaluations read (docs/tuning.md). test: the test sets, as ever. validation: each
    # client's validation split where a test split would be read, and their pool where the global
    # test set would be; the metrics read so are named val_* (val_accuracy, val_loss, ...), and the
    # run reads no test sample: how tuning runs its trials. Needs validation_fraction > 0.
    # test | validation
    evaluate_on: str = key("evaluation", "test", as_before="test", tunable=False, trial_differs=True)
    # evaluate every this many rounds (the last round, and each stage's last, always)
    eval_every: int = key("evaluation", 1, rule=bound(ge=1))
    # batch size for evaluation (does not change the numbers)
    eval_batch_size: int = key("evaluation", 512, rule=bound(ge=1))
    # train_accuracy and train_loss at each evaluation: every training client's predictor on its own
    # training split, as many samples as the training set (on 100 FMNIST clients 60,000, three times
    # the global test set). false skips them: `fedray report --at best-train` then has nothing to read.
    # train_accuracy / train_loss at each evaluation (see above)
    eval_train: bool = key("evaluation", True, as_before=True)
    # The training clients an evaluation walks for local_accuracy and train_accuracy: this many,
    # drawn once from the seed; with fedprox_synthetic also the clients whose test splits pool into
    # the global test set. Cross-device runs (10^5 clients and more) need it: otherwise every
    # evaluation visits every client. 0 = every client.
    # clients the evaluation walks, drawn once; 0 = all
    eval_clients: int = key("evaluation", 0, rule=bound(ge=0), as_before=0)

    # --- resources: placement, kernels, batched and packed training (docs/cluster.md#placement-fractional-gpus) --
    # Images (and convolution weights) in channels-last memory format: faster CNN steps on a CPU
    # (docs/benchmark.md#figures-behind-defaults); runs differ in the last bits from false, how runs
    # were computed before this key existed.
    # channels-last memory format for images and convolution weights
    channels_last: bool = key("resources", True, as_before=False, stack=True, pack=True)

    # CPUs reserved per client actor; torch threads = max(1, floor(this))
    num_cpus_per_actor: float = key("resources", 1.0, rule=bound(gt=0), setting=False, pack=True)
    # GPUs per client actor, fractional (e.g. 0.25 puts 4 actors on a GPU). auto: the cluster
    # decides when the run (the sweep) attaches to it: no GPU, 0; else each GPU shared by as many
    # actors as its node's CPUs hold, at most 4 (`fedray.federation.placement.auto_gpus_per_actor`), said in
    # one line. The run id, the saved config and the records carry the fraction it resolved to.
    num_gpus_per_actor: float | str = key(
        "resources", 0.0, rule=bound(ge=0, words=("auto",)), setting=False, pack=True
    )
    # client actors to start; 0 = as many as the cluster's resources allow (at most N)
    num_actors: int = key(
        "resources", 0, rule=bound(ge=0, note="0 = from resources"), in_run_id=False, setting=False
    )
    # On a GPU, CUDA's deterministic kernels (torch.use_deterministic_algorithms, cuDNN without
    # autotuning): the same config and seed give the same numbers run after run. false: CUDA's
    # default kernels, some of which sum in a varying order (runs then differ in the last bits, and
    # an unstable algorithm amplifies that). No effect on the CPU, which is deterministic anyway.
    # deterministic CUDA kernels on a GPU (see above)
    cuda_deterministic: bool = key("resources", True, as_before=True, pack=True)
    # On an Ampere or later GPU, cuDNN's convolutions in TF32 (10-bit mantissas), torch's default and
    # how the papers' code ran. false: float32 throughout, which brings batched and per-client GPU
    # training closer at some cost a step (docs/benchmark.md#figures-behind-defaults). No effect on
    # the CPU.
    # TF32 convolutions on an Ampere+ GPU (torch's default); false: float32
    cuda_tf32: bool = key("resources", True, as_before=True, pack=True)
    # Batched client training (fedray/engine/batched.py): the clients a worker runs in one call train as
    # one stacked model, each on its own batches, through torch.func.vmap: on a GPU many small
    # models per step instead of one. The numbers equal the per-client path's up to float
    # round-off. on: always (a model with BatchNorm or dropout is refused); auto: where the clients
    # run on a GPU and the model allows it; off: one client at a time. docs/batched.md lists the
    # client functions it covers (others run per client).
    # off | on | auto
    batched_clients: str = key("resources", "auto", as_before="auto", pack=True, on_off=True)
    # Packed runs (fedray/sweeps/pack.py): a sweep's runs that share the data set, the model and the local
    # training's batch, momentum, weight decay and epochs (each may have its own lr) train in one worker, each
    # round's client updates of all of them in one stack (each run keeps its own run id, results,
    # checkpoints and resume; its numbers are its own up to float round-off). on: pack them (needs
    # batched training: batched_clients on, or auto on a GPU); auto: where the runs share a GPU
    # (a fractional num_gpus_per_actor); off: every run alone. A pack is one worker of one client
    # actor's resources; its runs take no client actors. Sweeps only (`fedray run` runs one run:
    # nothing to pack). docs/batched.md#packed-runs.
    pack_runs: str = key("resources", "off", as_before="off", setting=False, on_off=True)  # off | on | auto
    # at most this many runs a pack
    pack_size: int = key("resources", 4, rule=bound(ge=1), in_run_id=False, setting=False)
    # Clients' persistent state (SCAFFOLD's c_i, kept SGD buffers, FedEM/FedRC's weights, ...) held in
    # memory per worker up to this many MB; beyond it, the least recently used go to local disk and
    # come back exactly when their client is next sampled (fedray/federation/client_states.py). 0 = a quarter
    # of the machine's memory shared out by CPUs (an actor of c CPUs on a machine of n cores:
    # c/n of it; workers on every core keep a quarter between them), all of it in-process (--local).
    # Changes no number.
    # per worker, MB
    client_state_memory_mb: float = key(
        "resources",
        0.0,
        rule=bound(ge=0, note="0 = a quarter of the machine's memory, shared out by the workers' CPUs"),
        in_run_id=False,
        setting=False,
    )
    # give up (loudly) if the actors cannot be placed within this time (a local Ray fedray started fails
    # at once)
    placement_timeout_s: float = key("resources", 300.0, rule=bound(gt=0), in_run_id=False, setting=False)

    # --- results: where results go, and the live loggers (docs/output.md#output) ----------------
    # results folder: metrics/, runs/, configs/, checkpoints/, models/
    output: str = key(
        "results",
        "out",
        text=True,
        in_run_id=False,
        setting=False,
        pack=True,
        tunable=False,
        trial_differs=True,
    )
    # write the trained models to DIR/models/RUN_ID/ when the run finishes
    save_models: bool = key("results", True, in_run_id=False, setting=False)
    # Live loggers (docs/loggers.md), each an optional extra: tensorboard (DIR/tb/RUN_ID/), mlflow,
    # wandb, or a plug-in's (fedray.storage.loggers.register_logger); none by default
    # the live loggers (--logger NAME)
    loggers: list[str] = key("results", factory=list, in_run_id=False, setting=False)
    # mlflow's tracking URI ("": sqlite:///DIR/mlflow.db)
    mlflow_tracking_uri: str = key("results", "", in_run_id=False, setting=False)
    # W&B's project ("": the experiment's name); WANDB_MODE=offline honoured
    wandb_project: str = key("results", "", in_run_id=False, setting=False)

    # --- recovery: surviving failures (none of these changes a number, so none is in the run id) ----
    # An unfinished run started again goes on from its latest checkpoint (--restart starts over).
    # checkpoint every this many rounds, and after the last; 0 = never
    checkpoint_every: int = key(
        "recovery", 10, rule=bound(ge=0, note="0 = never"), in_run_id=False, setting=False
    )
    # how many of the latest checkpoints DIR/checkpoints/RUN_ID/ keeps
    keep_checkpoints: int = key("recovery", 1, rule=bound(ge=1), in_run_id=False, setting=False)
    # false: a run's checkpoints are removed once it has finished (its rows and models written); an
    # unfinished run keeps them
    keep_finished_checkpoints: bool = key("recovery", True, in_run_id=False, setting=False)
    # Ray runs only: after losing client actors (a node lost, out of memory), new actors on what is
    # left of the cluster go on from the latest checkpoint.
    # times a run goes on after such a loss; 0 = fail at the first
    max_failures: int = key("recovery", 3, rule=bound(ge=0), in_run_id=False, setting=False)

    # ------------------------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def recorded(self) -> dict[str, Any]:
        """The config as a run records it (configs/RUN_ID.yaml, the runs table): each plug-in pinned
        to the source it ran (``PATH#sha256=HEX``), so that the saved config runs that source or
        refuses, and runs of two versions of a plug-in never read as seeds of one setting."""
        d = self.to_dict()
        if self.plugins:
            from fedray.config.plugins import pinned

            d["plugins"] = [pinned(s) for s in self.plugins]
        return d

    @property
    def gpus_auto(self) -> bool:
        """``num_gpus_per_actor: auto``, not yet resolved where the run goes (`with_gpus`)."""
        return self.num_gpus_per_actor == "auto"

    def with_gpus(self, share: float) -> Config:
        """This config with ``num_gpus_per_actor: auto`` replaced by ``share``, what the cluster the run
        goes to gives it (`fedray.federation.placement.auto_gpus_per_actor`); a number set by hand stays."""
        return dataclasses.replace(self, num_gpus_per_actor=float(share)) if self.gpus_auto else self

    def run_id(self) -> str:
        """Stable id of the run: the same resolved config gives the same id
        (`fedray.config.run_ids.run_id`, which names every run by one versioned rule)."""
        return run_id(self)

    def resolved_partition_file(self) -> str:
        return partition_file_for(self.partition_file, self.seed)

    def resolved_data_root(self) -> str:
        return data_root_for(self.dataset, self.data_root)

    @property
    def data_section(self) -> DataSection:
        """What the data layer reads of this config (`fedray.config.sections.DataSection`), as it
        stands now: a snapshot (a config changed after, as validation sets num_clients from a
        dataset's count, needs a new one)."""
        return DataSection(**{k: copy.deepcopy(getattr(self, k)) for k in DATA_KEYS})


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(Config)}
ROLES: dict[str, Role] = roles_of(Config)  # each key's roles, as its field declares them


def keys_where(test: Callable[[Role], bool]) -> tuple[str, ...]:
    """The config keys whose `Role` passes ``test``, in the order `Config` declares them."""
    return tuple(name for name, role in ROLES.items() if test(role))


# The lists of keys the rest of fedray reads, each from the keys' own roles (fedray/config/roles.py):
# Names people write unquoted (experiment: 2024, output: 1): a number there means its text.
NAME_KEYS = keys_where(lambda r: r.text)
# Keys that cannot change a number, left out of the run id.
NOT_IN_RUN_ID = keys_where(lambda r: not r.in_run_id)
# Keys added after results existed, with the value that means "as before": at that value they stay
# out of the run id, so every earlier run keeps its id (and a re-submitted sweep skips it).
ADDED_LATER = {name: role.as_before for name, role in ROLES.items() if role.added_later}
# Keys runs of one setting may differ in: the seed, what cannot change a number, where the work ran.
PER_RUN_KEYS = keys_where(lambda r: not r.setting)
# Keys that name a run (the results' columns, the report's and the loggers' labels).
LABEL_KEYS = keys_where(lambda r: r.label)
# Keys a search may not vary (what makes the validation data, the budget, the record).
FIXED_IN_SEARCH = keys_where(lambda r: not r.tunable)
# Keys whose values are registry names, which a plug-in adds to.
REGISTERED = keys_where(lambda r: r.registry)
# String keys whose values include on and off.
ON_OFF_KEYS = keys_where(lambda r: r.on_off)
# Flat keys a dataset may read as its own (`DatasetKind.keys`), which every other dataset refuses.
DATASET_KEYS = keys_where(lambda r: r.dataset_own)
# Keys that name a file by its path, whose content the run id hashes.
BY_CONTENT = keys_where(lambda r: r.by_content)
# Keys the runs of one pack share, and those the updates of one stack share.
PACK_KEYS = keys_where(lambda r: r.pack)
STACK_KEYS = keys_where(lambda r: r.stack)
# Keys a search's trials set otherwise than the test runs of the settings they tune.
TRIAL_KEYS = keys_where(lambda r: r.trial_differs)
# Each section's keys (a config file may be written in sections, fedray/config/roles.py SECTIONS).
SECTION_KEYS = {section: keys_where(lambda r, s=section: r.section == s) for section in SECTIONS}
# Keys of a sweep file that are not config keys (fedray/sweeps/sweep_file.py expands them into runs).
SWEEP_KEYS = ("grid", "seeds", "cases", "max_concurrent_runs")
# What other tools (and papers) call a key: an unknown key named here says "did you mean ...?"
# (close misspellings are suggested without this table; algorithm hyperparameters written without
# their hp. are found in the algorithm registry).
# Keys fedray once had, refused with what replaced them (not a suggestion: the old key meant
# something else, and a run that set it must be written anew).
RETIRED = {
    "leaf_user_fraction": (
        "it kept a fraction of the users, which is not LEAF's sampling; data.sample_fraction is LEAF's "
        "--sf (a fraction of each file's samples, taken by whole users), with data.min_samples (-k) "
        "applied after it as LEAF does"
    ),
}

MISNAMED = {
    "learning_rate": "lr",
    "local_lr": "lr",
    "client_lr": "lr",
    "epochs": "local_epochs",
    "local_epoch": "local_epochs",
    "num_rounds": "rounds",
    "comm_rounds": "rounds",
    "n_rounds": "rounds",
    "clients": "num_clients",
    "n_clients": "num_clients",
    "n_parties": "num_clients",
    "num_users": "num_clients",
    "batch": "batch_size",
    "bs": "batch_size",
    "wd": "weight_decay",
    "frac": "participation",
    "sample_fraction": "participation",
    "client_fraction": "participation",
    "alpha": "partition_beta",
    "beta": "partition_beta",
    "dirichlet_alpha": "partition_beta",
    "dirichlet_beta": "partition_beta",
    "partition_alpha": "partition_beta",
    "classes_per_client": "partition_k",
    "datadir": "data_root",
    "data_dir": "data_root",
    "random_seed": "seed",
    "output_dir": "output",
    "out_dir": "output",
}


def field_default(name: str) -> Any:
    """Config key ``name``'s default (a fresh copy for list defaults)."""
    f = FIELDS[name]
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


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
        text = raw.strip()
        try:
            if plain_key(key) in NAME_KEYS and not (
                len(text) > 1 and text[0] == text[-1] and text[0] in "'\""
            ):
                value = text  # a name or path as typed: '#C=2' is not a YAML comment, 2024 not a number
            else:
                value = load_yaml(raw, f"{flag} {key}: value {raw!r}") if text else ""
        except ConfigError as e:
            raise ConfigError(f"{flag} {key}: cannot parse value {raw!r}: {e}") from None
        set_dotted(out, key, value, where=f"{flag} {key}")
    return out


def typed_sets(sets: Iterable[str]) -> dict[str, str]:
    """``--set``s as the user typed them, by (dotted) key as the config names it (``training.lr``:
    ``lr``): what a message echoes back (``on``, not the ``true`` YAML reads it as; ``1e-2``, not
    ``0.01``). The last of a key's --sets wins."""
    out: dict[str, str] = {}
    for item in sets:
        key, _, raw = item.partition("=")
        out[plain_key(key.strip())] = raw.strip()
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


def unsection(
    tree: Mapping[str, Any], where: str = "config", problems: list[str] | None = None
) -> dict[str, Any]:
    """A config mapping written in sections (``run:``, ``training:``, ... `SECTIONS`) as the flat
    mapping `Config` reads: each section's keys lifted to the top. A flat mapping, or one mixing
    sections and top-level keys, loads the same. A key in a section that does not hold it, a key
    given both at the top and in its section, and a section that is not a mapping are refused in
    one error naming each (``where``: what the mapping is, for the message); with ``problems``
    they are added to it instead, for the config's checks to say with the rest. A name no config
    key has is lifted as it is: the config's checks name it, with their hints (``learning_rate``:
    did you mean ``lr``?)."""
    out = {k: v for k, v in tree.items() if k not in SECTIONS}
    found = []
    for section in SECTIONS:
        body = tree.get(section)
        if section not in tree or body is None:  # an empty section holds nothing
            continue
        if not isinstance(body, Mapping):
            hint = f"; did you mean '{MISNAMED[section]}'?" if section in MISNAMED else ""
            found.append(f"{where}: section '{section}' must be a mapping of its keys, got {body!r}{hint}")
            continue
        for name, value in body.items():
            name = str(name)
            owner = ROLES[name].section if name in ROLES else "source" if name in MOVED_TO_DATA else None
            if owner is not None and owner != section:
                found.append(
                    f"config key '{section}.{name}': {name} is in section '{owner}', not '{section}'"
                )
            elif name in out:
                found.append(f"config key '{name}' is given twice: at the top and in section '{section}'")
            else:
                out[name] = value
    if found and problems is None:
        raise ConfigError.of(found)
    if problems is not None:
        problems.extend(found)
    return out


def plain_key(name: str) -> str:
    """A dotted key without the section it may be written with (``training.lr``: ``lr``), unchecked."""
    section, dot, rest = name.partition(".")
    return rest if dot and section in SECTIONS else name


def flat_key(name: str) -> str:
    """A dotted key as `Config` names it: ``training.lr`` is ``lr`` (checked to be in that section),
    ``run.hp.mu`` is ``hp.mu``; any other name as it is."""
    rest = plain_key(name)
    if rest != name:  # the key is the section's, or an error
        unsection({name.partition(".")[0]: {rest.split(".")[0]: None}}, name)
    return rest


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


def merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = merge(dict(out[k]), v)
        else:
            out[k] = v
    return out


# What a config or sweep file may be (the largest shipped is a few KB): a file, a nesting or an
# alias bomb beyond these is refused in one line before it costs gigabytes and minutes.
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 32  # mappings and lists inside each other
MAX_VALUES = 100_000  # values in all, aliases expanded (a "billion laughs" expands to 10^9)


class _Refused(Exception):
    """A YAML document past one of the limits above."""


def _expanded(node: yaml.Node, sizes: dict[int, int], open_: set[int]) -> int:
    """How many values ``node`` is, its aliases expanded (each anchor counted once a use)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise _Refused("an alias refers to the value it is in (a recursive structure)")
    open_.add(key)
    total = 1
    if isinstance(node, yaml.SequenceNode):
        total += sum(_expanded(v, sizes, open_) for v in node.value)
    elif isinstance(node, yaml.MappingNode):
        total += sum(_expanded(k, sizes, open_) + _expanded(v, sizes, open_) for k, v in node.value)
    open_.discard(key)
    sizes[key] = total
    if total > MAX_VALUES:
        raise _Refused(f"more than {MAX_VALUES:,} values once its aliases are expanded")
    return total


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing documents nested deeper than `MAX_DEPTH` or of more than
    `MAX_VALUES` values once aliases are expanded."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} levels deep")
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: Any) -> Any:
        _expanded(node, {}, set())
        return super().construct_document(node)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """A mapping that gives a key twice is refused: YAML would keep the last without a word (a
        key merged in with ``<<`` and given again is an override, as YAML means it)."""
        seen: dict[Any, int] = {}
        for key_node, _ in node.value if isinstance(node, yaml.MappingNode) else ():
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise _Refused(
                        f"key {key!r} is given twice (lines {seen[key]} and {line}); YAML would keep the last"
                    )
            except TypeError:  # an unhashable key: the loader says so itself
                continue
            seen[key] = line
        return super().construct_mapping(node, deep)


def load_yaml(text: str, where: str) -> Any:
    """``text`` read as YAML within the limits; what is wrong is a `ConfigError` naming ``where``."""
    try:
        loader = _BoundedLoader(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {e}") from None
    try:
        return loader.get_single_data()
    except _Refused as e:
        raise ConfigError(f"{where}: refused: {e}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {e}") from None
    finally:
        loader.dispose()


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        what = "is a folder, not a file" if p.is_dir() else "does not exist"
        raise ConfigError(f"config file {str(p)!r} {what}")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise ConfigError(
            f"config file {str(p)!r} is {size:,} bytes; a config or sweep file is at most {MAX_FILE_BYTES:,}"
        )
    data = load_yaml(p.read_text(), f"config file {str(p)!r}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r}: expected a mapping of keys to values at the top level")
    return data


@functools.cache
def _config_hints() -> dict[str, Any]:
    return typing.get_type_hints(Config)


def field_type(name: str) -> Any:
    return _config_hints()[name]


def dump_yaml(cfg: Config) -> str:
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
