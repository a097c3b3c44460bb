"""`partition: file` and DIR/partitions/: a run's partition written out, read back, and bad files
rejected before anything starts, naming the file and the client."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import load_metrics, load_partitions
from fedray.config.keys import ConfigError
from fedray.data import build_federated_data
from fedray.data import partition_file as pf
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import execute
from fedray.records import TIMING_METRICS
from tests.conftest import small_config

TRAIN = 600  # small_config's synthetic training set


def run(cfg) -> None:
    for _ in execute(cfg, make_local_federation):
        pass


def numbers(out: Path) -> pd.DataFrame:
    m = load_metrics(out)
    keep = ~m["metric"].isin(TIMING_METRICS)  # wall times differ
    return m[keep].sort_values(["round", "metric", "scope", "entity"])[
        ["round", "metric", "scope", "entity", "value"]
    ]


@pytest.mark.parametrize("fraction", [0.0, 0.2])
def test_a_runs_exported_partition_fed_back_gives_the_same_numbers_bit_for_bit(tmp_path, fraction):
    a = small_config(tmp_path / "a", client_test_fraction=fraction, rounds=2)
    run(a)
    exported = tmp_path / "a" / "out" / "partitions" / f"{a.run_id()}.parquet"
    parts = load_partitions(tmp_path / "a" / "out")
    assert set(parts["split"]) == ({"train", "test"} if fraction else {"train"})
    assert len(parts) == TRAIN  # every sample once, in one client and split
    b = small_config(tmp_path / "b", partition="file", partition_file=str(exported), rounds=2)
    run(b)
    assert b.run_id() != a.run_id()
    pd.testing.assert_frame_equal(
        numbers(tmp_path / "a" / "out").reset_index(drop=True),
        numbers(tmp_path / "b" / "out").reset_index(drop=True),
    )
    # ... and the second run writes the same partition again
    again = load_partitions(tmp_path / "b" / "out")
    assert parts[["client", "split", "index"]].equals(again[["client", "split", "index"]])


def test_json_file_clients_and_test_splits_are_used_as_given(tmp_path):
    train = [np.arange(0, 100)[::-1], np.arange(100, 300), np.arange(300, 590)]
    test = [np.array([590, 591]), np.array([592]), np.array([], dtype=np.int64)]
    path = tmp_path / "p.json"
    pf.write_json(path, train, TRAIN, test=test, groups=np.array([0, 1, 1]), dataset="synthetic")
    cfg = small_config(tmp_path, num_clients=3, partition="file", partition_file=str(path))
    data = build_federated_data(cfg)
    assert np.array_equal(data.clients[0].train, train[0])  # the file's order kept
    assert np.array_equal(data.clients[0].test, [590, 591])
    assert len(data.clients[2].test) == 0
    assert data.groups.tolist() == [0, 1, 1]


def test_seed_placeholder_and_run_id_follow_the_files_content_not_its_path(tmp_path):
    for seed, n in ((0, 100), (1, 150)):
        pf.write_json(tmp_path / f"p-s{seed}.json", [np.arange(n), np.arange(n, 600)], TRAIN)
    template = str(tmp_path / "p-s{seed}.json")
    c0 = small_config(tmp_path, num_clients=2, partition="file", partition_file=template, seed=0)
    c1 = small_config(tmp_path, num_clients=2, partition="file", partition_file=template, seed=1)
    assert len(build_federated_data(c0).clients[0].train) == 100
    assert len(build_federated_data(c1).clients[0].train) == 150
    copy = tmp_path / "elsewhere.json"
    copy.write_bytes((tmp_path / "p-s0.json").read_bytes())
    moved = small_config(tmp_path, num_clients=2, partition="file", partition_file=str(copy), seed=0)
    assert moved.run_id() == c0.run_id()  # same clients, same run, wherever the file lies
    named = small_config(
        tmp_path, num_clients=2, partition="file", partition_file=str(copy), partition_name="#C=2"
    )
    assert named.run_id() == c0.run_id()  # the name is only a label


def write(tmp_path: Path, doc) -> str:
    p = tmp_path / "bad.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


def good(**clients) -> dict:
    return {"train_size": TRAIN, "clients": {"0": {"train": [0, 1, 2]}, "1": {"train": [3, 4]}, **clients}}


BAD = [
    ("missing file", None, "does not exist"),
    ("not json", "{oops", "is not valid JSON"),
    ("no train_size", {"clients": {"0": {"train": [1]}}}, '"train_size" (an integer) is missing'),
    (
        "unknown index",
        good(**{"1": {"train": [3, 600]}}),
        "client 1's train split has index 600, outside the training set",
    ),
    ("negative index", good(**{"1": {"train": [-1]}}), "client 1's train split has index -1"),
    (
        "duplicate across clients",
        good(**{"1": {"train": [2, 5]}}),
        "index 2 is in client 1's train split and in client 0",
    ),
    (
        "duplicate in train and test",
        good(**{"1": {"train": [5], "test": [5]}}),
        "index 5 is in client 1's test split and in its own other split",
    ),
    (
        "duplicate within a client",
        good(**{"1": {"train": [5, 5]}}),
        "client 1's train split lists index 5 more than once",
    ),
    ("empty client", good(**{"1": {"train": []}}), "client 1 has no training samples"),
    ("missing client", good(**{"1": None, "2": {"train": [9]}}), "client(s) 1 missing"),
    ("unknown field", good(**{"1": {"train": [4], "tset": [5]}}), "client 1: unknown field(s) tset"),
    (
        "wrong dataset size",
        {"train_size": 60000, "clients": {"0": {"train": [1]}, "1": {"train": [2]}}},
        "partitions a training set of 60000 samples, but synthetic has 600",
    ),
    (  # before: 74.5 GiB asked for an index table of 10^10 entries ahead of the size check
        "a huge train_size allocates nothing",
        {"train_size": 10**10, "clients": {"0": {"train": [1]}, "1": {"train": [2]}}},
        "partitions a training set of 10000000000 samples, but synthetic has 600",
    ),
    (
        "wrong client count",
        {"train_size": TRAIN, "clients": {"0": {"train": [1]}}},
        "holds 1 clients; set num_clients: 1",
    ),
]


@pytest.mark.parametrize("name,doc,message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_partition_file_is_a_config_error_naming_file_and_client(tmp_path, name, doc, message):
    if isinstance(doc, dict) and doc.get("clients", {}).get("1", "") is None:
        del doc["clients"]["1"]
    path = str(tmp_path / "absent.json") if doc is None else write(tmp_path, doc)
    with pytest.raises(ConfigError) as e:
        small_config(tmp_path, num_clients=2, partition="file", partition_file=path)
    assert message in str(e.value)
    assert path in str(e.value) or "num_clients" in str(e.value)


def test_file_keys_are_checked_with_the_rest_of_the_config(tmp_path):
    with pytest.raises(ConfigError, match="partition: file needs partition_file"):
        small_config(tmp_path, partition="file")
    with pytest.raises(ConfigError, match=r"'partition_file' is not read by partition 'dirichlet'"):
        small_config(tmp_path, partition_file="x.json")
    path = tmp_path / "t.json"
    pf.write_json(path, [np.arange(300), np.arange(300, 590)], TRAIN, test=[np.arange(590, 600), np.zeros(0)])
    with pytest.raises(ConfigError, match="gives each client's test split; set client_test_fraction: 0"):
        small_config(
            tmp_path, num_clients=2, partition="file", partition_file=str(path), client_test_fraction=0.1
        )


def test_cli_rejects_a_bad_partition_file_before_ray_starts(tmp_path):
    import subprocess
    import sys

    path = write(tmp_path, good(**{"1": {"train": [3, 999]}}))
    no_ray = (
        "import sys; from jobs.cli import main; rc = main(sys.argv[1:]); "
        "assert 'ray' not in sys.modules, 'ray was imported'; sys.exit(rc)"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            no_ray,
            "run",
            "--set",
            "dataset=synthetic",
            "--set",
            "synthetic_size=600",
            "--set",
            "num_clients=2",
            "--set",
            "partition=file",
            "--set",
            f"partition_file={path}",
            "--output",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert f"partition file '{path}': client 1's train split has index 999" in out.stderr
    assert not (tmp_path / "out").exists()
