"""Each client's validation split (validation_fraction) and runs that evaluate on it instead of the
test sets (evaluate_on: validation): how tuning chooses without reading a test sample."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import fedray.data as data_module
from fedray.config.keys import ConfigError
from fedray.data import build_federated_data
from fedray.data.datasets import ArrayDataset
from fedray.data.validation import held_out
from fedray.experiment.checks import from_dict
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import Finished, execute
from tests.helpers import round_metrics


def config(tmp_path, **over):
    base = {"num_clients": 6, "rounds": 2, "local_epochs": 1, "output": str(tmp_path / "out")}
    return from_dict({**base, **over})


@pytest.mark.parametrize(
    "n, fraction, want", [(10, 0.1, 1), (25, 0.1, 2), (26, 0.1, 3), (2, 0.9, 1), (1, 0.5, 0), (0, 0.5, 0)]
)
def test_a_client_holds_out_round_f_n_and_keeps_one_to_train_on(n, fraction, want):
    assert held_out(n, fraction) == want


def test_the_validation_split_is_held_out_of_training_from_the_data_seed(tmp_path):
    plain = build_federated_data(config(tmp_path, client_test_fraction=0.2))
    held = build_federated_data(config(tmp_path, client_test_fraction=0.2, validation_fraction=0.25))
    for cid, ix in plain.clients.items():
        h = held.clients[cid]
        n = len(ix.train)
        assert len(h.val) == held_out(n, 0.25) and len(h.train) == n - len(h.val)
        # the rest train in their order; the test split is the client's as before
        assert set(h.train) | set(h.val) == set(ix.train) and not set(h.train) & set(h.val)
        assert list(h.train) == [i for i in ix.train if i in set(h.train)]
        assert np.array_equal(h.test, ix.test)
    # the data seed's, not the training seed's: another seed holds out the same samples
    other = build_federated_data(
        config(tmp_path, client_test_fraction=0.2, validation_fraction=0.25, seed=9, data_seed=0)
    )
    assert all(np.array_equal(other.clients[c].val, held.clients[c].val) for c in held.clients)
    # the partition written for `partition: file` is the clients as the partition made them
    assert all(np.array_equal(held.partition_clients[c].train, plain.clients[c].train) for c in plain.clients)
    rows = held.partition_rows()
    assert sorted(rows["index"][(rows["client"] == 0) & (rows["split"] == "train")]) == sorted(
        plain.clients[0].train
    )


def test_evaluating_on_validation_reads_the_validation_splits_in_the_test_sets_place(tmp_path):
    held = build_federated_data(
        config(tmp_path, client_test_fraction=0.2, validation_fraction=0.25, evaluate_on="validation")
    )
    vals = [held.clients[c].val for c in sorted(held.clients)]
    assert all(np.array_equal(held.clients[c].test, held.clients[c].val) for c in held.clients)
    pooled = np.concatenate(vals)
    assert np.array_equal(held.dataset.test.y, held.dataset.train.y[pooled])
    assert np.array_equal(held.dataset.test.x, held.dataset.train.x[pooled])


def poisoned(real):
    """``_federate`` whose test samples spoil any evaluation that reads them: the global test set's
    and the clients' own test rows' inputs are NaN (a NaN loss) and their labels -1 (which
    cross-entropy refuses)."""

    def federate(cfg):
        data = real(cfg)
        x, y = data.dataset.train.x.astype(np.float32), data.dataset.train.y.copy()
        for ix in data.clients.values():
            x[ix.test], y[ix.test] = np.nan, -1
        test = ArrayDataset(
            np.full(data.dataset.test.x.shape, np.nan, np.float32), np.full_like(data.dataset.test.y, -1)
        )
        data.dataset = replace(data.dataset, train=ArrayDataset(x, y), test=test)
        return data

    return federate


@pytest.mark.parametrize(
    "algorithm, hp",
    [
        ("fedavg", {}),
        ("ifca", {"num_clusters": 2}),
        ("fedrc", {"num_clusters": 2}),
        ("fedconcat", {"num_clusters": 2, "encoder_rounds": 1, "classifier_rounds": 1}),
    ],
)
def test_a_run_on_validation_reads_no_test_sample(tmp_path, monkeypatch, algorithm, hp):
    monkeypatch.setattr(data_module, "_federate", poisoned(data_module._federate))
    keys = dict(algorithm=algorithm, hp=hp, client_test_fraction=0.2, validation_fraction=0.2)
    on_test = config(tmp_path / "test", **keys)
    try:  # on test, the poison is found: an evaluation refuses it, or its loss is NaN
        list(execute(on_test, make_local_federation))
        losses = round_metrics(on_test.output).query("metric == 'loss'")["value"]
        assert not np.isfinite(losses).all()
    except Exception as e:  # noqa: BLE001 - whichever way the evaluation fails on it
        assert "-1" in str(e) or "out of bounds" in str(e) or "non-finite" in str(e), e
    cfg = config(tmp_path / "val", evaluate_on="validation", **keys)
    events = list(execute(cfg, make_local_federation))
    assert isinstance(events[-1], Finished)
    m = round_metrics(cfg.output)
    names = set(m["metric"])
    assert "val_accuracy" in names and "val_loss" in names and "accuracy" not in names and "loss" not in names
    assert np.isfinite(m["value"]).all()
    assert 0 <= events[-1].summary["final_val_accuracy"] <= 1 and "final_accuracy" not in events[-1].summary


def test_validation_numbers_are_the_same_in_process_and_on_ray(ray_session, tmp_path):
    from actors.federation import make_ray_federation

    keys = dict(algorithm="ifca", hp={"num_clusters": 2}, validation_fraction=0.2, evaluate_on="validation")
    local = config(tmp_path / "local", **keys)
    list(execute(local, make_local_federation))
    ray = config(tmp_path / "ray", num_actors=3, **keys)
    list(execute(ray, make_ray_federation))
    a, b = round_metrics(local.output), round_metrics(ray.output)
    assert a.equals(b) and "val_local_accuracy" in set(a["metric"])


def test_every_kind_of_data_holds_out_its_validation_split(tmp_path):
    from tests.data.test_leaf import write_leaf

    root = write_leaf(tmp_path / "femnist", {"a": 12, "b": 9, "c": 7}, files=1)
    cases = [
        dict(dataset="femnist", data_root=str(root), model="leaf_cnn", num_clients=None),
        dict(dataset="fedprox_synthetic", model="logreg", num_clients=4),
        dict(dataset="digits", partition="iid"),
    ]
    for keys in cases:
        keys = {k: v for k, v in keys.items() if v is not None}
        if "num_clients" not in keys and keys["dataset"] != "digits":
            base = {"rounds": 1, "output": str(tmp_path / "o")}
            plain = build_federated_data(from_dict({**base, **keys}))
            held = build_federated_data(
                from_dict({**base, **keys, "validation_fraction": 0.3, "evaluate_on": "validation"})
            )
        else:
            plain = build_federated_data(config(tmp_path, **keys))
            held = build_federated_data(
                config(tmp_path, **keys, validation_fraction=0.3, evaluate_on="validation")
            )
        for c in list(plain.clients)[:3]:
            p, h = plain.clients[c], held.clients[c]
            assert len(h.train) == len(p.train) - held_out(len(p.train), 0.3), keys["dataset"]
            assert len(h.test) == held_out(len(p.train), 0.3), keys["dataset"]
        if (
            held.sourced
        ):  # made on demand: the samples a client is given are its training then its validation ones
            made, whole = held.clients.source.samples(0), plain.clients.source.samples(0)
            n = plain.clients.source.split(0)[0]
            assert sorted(map(bytes, made.x)) == sorted(map(bytes, whole.x[:n]))


def test_bad_validation_settings_are_one_line_before_anything_runs(tmp_path):
    with pytest.raises(
        ConfigError,
        match=r"^config key 'evaluate_on': validation reads each client's validation split, and validation_fraction is 0",
    ):
        config(tmp_path, evaluate_on="validation")
    with pytest.raises(ConfigError, match=r"^config key 'evaluate_on': unknown value 'val'"):
        config(tmp_path, evaluate_on="val", validation_fraction=0.1)
    with pytest.raises(ConfigError, match=r"^config key 'validation_fraction': must be in \[0, 1\)"):
        config(tmp_path, validation_fraction=1.0)
