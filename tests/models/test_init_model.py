"""init_model: any algorithm starts from a finished run's saved model (warm starts, fine-tuning,
continuing a run with another algorithm); a missing file or a model of another architecture is
refused before any data is read or Ray starts; the run id names the model's content."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from fedray.algorithms import ALGORITHMS
from fedray.config.keys import ConfigError
from fedray.data import build_federated_data
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import execute
from tests.conftest import small_config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished FedAvg run's models folder."""
    cfg = small_config(tmp_path_factory.mktemp("trained"), rounds=2)
    list(execute(cfg, make_local_federation))
    return cfg, next((tmp_path_factory.getbasetemp() / "trained0" / "out" / "models").iterdir())


def saved_global(folder):
    with np.load(folder / "global.npz") as npz:
        return {k: npz[k] for k in npz.files}


@pytest.mark.parametrize("algorithm", ["fedavg", "ifca", "fedcat"])
def test_every_initial_model_starts_from_the_saved_one(tmp_path, trained, algorithm):
    _, folder = trained
    over = {"ifca": {"hp": {"num_clusters": 3}}, "fedcat": {"participation": 0.5}}.get(algorithm, {})
    cfg = small_config(tmp_path, algorithm=algorithm, init_model=str(folder), **over)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    alg = ALGORITHMS[algorithm]
    state = alg.init(fed, alg.make_hparams(cfg.hp))
    models = state.models if algorithm == "ifca" else [state.params]
    want = saved_global(folder)
    assert len(models) == (3 if algorithm == "ifca" else 1)
    for m in models:  # each of K cluster models too
        for k in want:
            np.testing.assert_array_equal(m[k], want[k])
    fresh = small_config(tmp_path / "fresh", algorithm=algorithm, **over)
    fed2, _ = make_local_federation(fresh, build_federated_data(fresh))
    s2 = alg.init(fed2, alg.make_hparams(fresh.hp))
    first = (s2.models if algorithm == "ifca" else [s2.params])[0]
    assert not all(np.array_equal(first[k], want[k]) for k in want)  # without it: a fresh draw


def test_a_warm_start_goes_on_from_the_trained_accuracy(tmp_path, trained):
    base, folder = trained
    from analysis import load_metrics

    acc = load_metrics(base.output).query("metric == 'accuracy'")["value"].iloc[-1]
    cfg = small_config(tmp_path, rounds=1, init_model=str(folder / "global.npz"))
    list(execute(cfg, make_local_federation))
    fresh = small_config(tmp_path / "fresh", rounds=1)
    list(execute(fresh, make_local_federation))
    warm = load_metrics(cfg.output).query("metric == 'accuracy'")["value"].iloc[-1]
    cold = load_metrics(fresh.output).query("metric == 'accuracy'")["value"].iloc[-1]
    assert warm > cold and warm >= acc - 0.1


def test_the_run_id_names_the_models_content_not_its_path(tmp_path, trained):
    _, folder = trained
    a = small_config(tmp_path, init_model=str(folder))
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    assert small_config(tmp_path, init_model=str(copy / "global.npz")).run_id() == a.run_id()
    assert a.run_id() != small_config(tmp_path).run_id()  # a fresh draw is another run
    params = saved_global(copy)
    params[next(iter(params))] = params[next(iter(params))] + 1.0
    np.savez(copy / "global.npz", **params)
    assert small_config(tmp_path, init_model=str(copy)).run_id() != a.run_id()  # changed model: new run


def test_bad_init_models_are_refused_before_anything_runs(tmp_path, trained):
    _, folder = trained
    with pytest.raises(ConfigError, match=r"'init_model': .*nope: no such file or folder"):
        small_config(tmp_path, init_model=str(tmp_path / "nope"))
    with pytest.raises(
        ConfigError,
        match=r"'init_model': .*another architecture \(mlp on 1x8x8 inputs, 10 "
        r"classes\); this run builds mlp without head bias",
    ):
        small_config(tmp_path, init_model=str(folder), head_bias=False)
    (tmp_path / "stray.npz").write_bytes((folder / "global.npz").read_bytes())
    with pytest.raises(ConfigError, match=r"'init_model': .*no saved models"):  # no index.json beside it
        small_config(tmp_path, init_model=str(tmp_path / "stray.npz"))
    # FedConcat's concatenated global model is not of the task's architecture; its folder names the others
    fc = small_config(
        tmp_path / "fc", algorithm="fedconcat", rounds=3, hp={"num_clusters": 2, "encoder_rounds": 2}
    )
    list(execute(fc, make_local_federation))
    fc_models = next((tmp_path / "fc" / "out" / "models").iterdir())
    with pytest.raises(ConfigError, match=r"'init_model': .*another architecture .*concatenated"):
        small_config(tmp_path, init_model=str(fc_models))
    cfg = small_config(tmp_path / "ok", init_model=str(fc_models / "cluster-1.npz"))  # one of its clusters
    assert cfg.init_model.endswith("cluster-1.npz")


def test_a_damaged_npz_is_one_error_naming_it_before_anything_runs(tmp_path, trained):
    # Before: zipfile.BadZipFile tracebacks (a cut-short arrays file at validation, a damaged member
    # of an arrays file when the run built its data, a damaged saved model).
    from sklearn.datasets import load_digits

    d = load_digits()
    good = tmp_path / "arrays.npz"
    x = d.images.astype(np.float32)[:, None]
    np.savez(good, x_train=x[:1500], y_train=d.target[:1500], x_test=x[1500:], y_test=d.target[1500:])
    raw = good.read_bytes()
    cut, flipped = tmp_path / "cut.npz", tmp_path / "flipped.npz"
    cut.write_bytes(raw[:5000])
    middle = len(raw) // 3
    flipped.write_bytes(raw[:middle] + bytes(64) + raw[middle + 64 :])
    arrays = dict(dataset="arrays", model="mlp")
    small_config(tmp_path, data_root=str(good), **arrays)  # the file as written is fine
    with pytest.raises(ConfigError, match=r"'data_root': .*cut\.npz: not a readable \.npz file \(BadZipFile"):
        small_config(tmp_path, data_root=str(cut), **arrays)
    with pytest.raises(
        ConfigError, match=r"'data_root': .*flipped\.npz: x_train\.npy is damaged \(its CRC-32"
    ):
        small_config(tmp_path, data_root=str(flipped), **arrays)
    _, folder = trained
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    model = (copy / "global.npz").read_bytes()
    (copy / "global.npz").write_bytes(model[: len(model) // 2] + bytes(32) + model[len(model) // 2 + 32 :])
    with pytest.raises(
        ConfigError, match=r"'init_model': .*global\.npz: not a readable \.npz file \(BadZipFile: Bad CRC"
    ):
        small_config(tmp_path, init_model=str(copy))
