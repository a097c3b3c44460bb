"""The config's sections: what one layer reads of a run's config, typed and nothing more.

The YAML a user writes stays flat and `Config` stays its schema (one key, one default, one meaning);
a section is the part of it one layer below the experiment layer reads, built from a checked
Config (`Config.data_section`) and handed to that layer's functions. This module is a leaf below
`fedray.config.keys`, which composes the sections from its keys. Its fields are named as the
config keys they come from, so a hook written against ``cfg.num_clients`` reads the section the
same way; a key the section does not hold is an `AttributeError` naming the key and the section,
rather than a silent reach into the rest of the config.

- `DataSection`: the data layer's (`fedray.data`): the dataset and its own settings, the partition
  across clients, the clients' test and validation splits, and the seeds and evaluation clients
  they are drawn from. Every `DatasetKind` and `PartitionScheme` hook takes it.

The other layers take what they use as values: the engine and the federation a `Task` (built
field by field in `fedray.experiment.local.task_for`), storage the run's id and its config as a
mapping, an algorithm's check `fedray.algorithms.RunPlan`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DATA_KEYS",
    "MOVED_TO_DATA",
    "DEFAULT_FMNIST_ROOT",
    "DataSection",
    "data_root_for",
    "partition_file_for",
]

DEFAULT_FMNIST_ROOT = "/usr/share/datasets/fashion-mnist"


def data_root_for(dataset: str, data_root: str) -> str:
    """The folder a dataset is read from: data_root, or where the dataset lies by default
    (Fashion-MNIST: Debian's package; the others: ./data)."""
    if data_root:
        return data_root
    return DEFAULT_FMNIST_ROOT if dataset == "fmnist" else "data"


def partition_file_for(path_template: str, seed: int) -> str:
    """The partition file a run reads: ``{seed}`` in the configured path replaced by the run's seed."""
    return path_template.replace("{seed}", str(seed))


@dataclass(frozen=True)
class DataSection:
    """What makes a run's clients' data: the data layer's part of the config (module docstring).
    Each field is the config key of its name, documented in `Config`."""

    # the seeds: the run's, and the data's own (null: the dataset's default, `fedray.data.data_seed`)
    seed: int
    data_seed: int | None
    # the dataset and its keys
    dataset: str
    data_root: str
    download: bool
    emnist_split: str
    synthetic_size: int
    synthetic_shape: list[int]
    synthetic_alpha: float
    synthetic_beta: float
    data: dict[str, Any]  # the dataset's own settings (data.NAME), checked by its DatasetKind
    # the partition across clients
    num_clients: int
    partition: str
    partition_file: str
    partition_name: str
    partition_k: int
    partition_beta: float
    partition_clusters: int
    partition_size: int
    partition_min_size: int
    shift: str
    # the clients' own splits, and the clients an evaluation walks (drawn with the data)
    client_test_fraction: float
    validation_fraction: float
    evaluate_on: str
    eval_clients: int

    def resolved_data_root(self) -> str:
        """The folder the dataset is read from: data_root, or the dataset's default."""
        return data_root_for(self.dataset, self.data_root)

    def resolved_partition_file(self) -> str:
        """The partition file a run reads: ``{seed}`` in partition_file replaced by the run's seed."""
        return partition_file_for(self.partition_file, self.seed)

    def __getattr__(self, name: str) -> Any:  # only for names that are not fields
        if name.startswith("__"):  # what copy and pickle look for
            raise AttributeError(name)
        raise AttributeError(
            f"{name!r} is not in the data section: a dataset's or a partition's hook reads the config "
            f"keys of fedray.config.sections.DataSection ({', '.join(DATA_KEYS)})"
        )


DATA_KEYS = tuple(f.name for f in dataclasses.fields(DataSection))

# Flat keys that moved into a dataset's own settings (config key data.NAME): old name -> (its name
# under data, its default). A config naming the old key still loads (it is moved, with a note), and a
# run id hashes a moved value under its old name, so every run keeps the id it had.
MOVED_TO_DATA = {
    "leaf_sample_fraction": ("sample_fraction", None),
    "leaf_min_samples": ("min_samples", 0),
    "leaf_train_fraction": ("train_fraction", 0.9),
    "leaf_split_seed": ("split_seed", None),
    "hf_name": ("name", ""),
    "hf_split": ("split", "train"),
    "hf_test_split": ("test_split", ""),
    "hf_client_column": ("client_column", ""),
    "hf_input_column": ("input_column", ""),
    "hf_label_column": ("label_column", ""),
}
