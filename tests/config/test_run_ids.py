"""Run ids stay what they were: existing results folders skip and resume their runs. Every shipped
config and sweep that loads here gives the run ids it gave at commit f4b49b0
(tests/config/run_ids_f4b49b0.json, written by that commit's code), and LEAF's and hf's keys, moved
under data:, give the ids their flat keys gave (worked out before they moved)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import yaml

from fedray.experiment.checks import load_config
from fedray.sweeps.sweep_file import load_sweep
from tests.conftest import ROOT

KEPT = json.loads((ROOT / "tests" / "config" / "run_ids_f4b49b0.json").read_text())


@pytest.mark.parametrize("name", sorted(KEPT))
def test_every_shipped_config_and_sweep_keeps_its_run_ids(name):
    path = ROOT / "jobs" / "configs" / name
    raw = yaml.safe_load(path.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if any(k in raw for k in ("grid", "seeds", "cases")):
            got = sorted(r.run_id for r in load_sweep(path).runs)
        else:
            got = [load_config(path).run_id()]
    assert got == KEPT[name]


def test_leafs_and_hfs_keys_moved_under_data_keep_the_run_ids_of_their_flat_keys(
    tmp_path, monkeypatch, capsys
):
    from tests.data.test_hf import femnist_like
    from tests.data.test_leaf import write_leaf

    monkeypatch.chdir(tmp_path)  # data_root is in the run id: the same relative folders as when worked out
    write_leaf(Path("leaf"), {"f_a": 12, "f_b": 10, "f_c": 9, "f_d": 3})
    femnist_like(Path("hfdata"))
    leaf = {"dataset": "femnist", "data_root": "leaf", "model": "leaf_cnn"}
    flat = {
        "leaf_sample_fraction": 0.5,
        "leaf_min_samples": 2,
        "leaf_split_seed": 7,
        "leaf_train_fraction": 0.8,
    }
    nested = {"sample_fraction": 0.5, "min_samples": 2, "split_seed": 7, "train_fraction": 0.8}
    old = load_config(raw={**leaf, **flat})
    assert (
        old.run_id() == load_config(raw={**leaf, "data": nested}).run_id() == "fedavg-femnist-s0-336746a9df"
    )
    assert old.data == dict(sorted(nested.items())) and old.num_clients == 3
    said = capsys.readouterr().err
    assert "config key 'leaf_min_samples' is 'data.min_samples' now" in said  # said once a key
    assert load_config(raw=leaf).run_id() == "fedavg-femnist-s0-3abbcb6d1a"
    hf = {"dataset": "hf", "model": "leaf_cnn", "client_test_fraction": 0.2}
    columns = {"client_column": "writer_id", "input_column": "image", "label_column": "character"}
    old = load_config(
        raw={**hf, **{f"hf_{k}": v for k, v in columns.items()}, "hf_name": "hfdata", "leaf_min_samples": 5}
    )
    new = load_config(raw={**hf, "data": {**columns, "name": "hfdata", "min_samples": 5}})
    assert old.run_id() == new.run_id() == "fedavg-hf-s0-6d09c59640" and new.num_clients == 2
    # a resolved config of a digits run written before the keys moved (every key, at its default) loads
    with pytest.raises(Exception, match="is 'data.min_samples' now, and the two are set to different values"):
        load_config(raw={**leaf, "leaf_min_samples": 3, "data": {"min_samples": 2}})
    digits = load_config(
        raw={"dataset": "digits", "leaf_min_samples": 0, "hf_name": "", "leaf_split_seed": None}
    )
    assert digits.data == {} and digits.run_id() == load_config(raw={"dataset": "digits"}).run_id()
