"""Whether a run drops each epoch's last partial batch is decided once (the config key drop_last,
or the algorithm's own hp.drop_last: `fedray.experiment.local.drops_last`), carried by the Task and
applied by the engine to every update: the two ways to ask for it give the same numbers."""

from __future__ import annotations

import dataclasses

import pytest

from fedray.experiment.checks import from_dict
from fedray.experiment.local import drops_last, task_for
from tests.conftest import small_config
from tests.helpers import run_metrics


def test_a_runs_drop_last_is_the_config_key_or_the_algorithms_own_decided_once(tmp_path):
    def decided(**over):
        cfg = small_config(tmp_path, **over)
        spec = type("Spec", (), {})()  # task_for reads the spec only to carry it
        return drops_last(cfg), task_for(cfg, spec).drop_last

    assert decided() == (False, False)
    assert decided(drop_last=True) == (True, True)
    assert decided(algorithm="ifca", hp={"num_clusters": 2, "drop_last": True}) == (True, True)
    assert decided(algorithm="fedem", hp={"num_clusters": 2}) == (True, True)  # FedEM's code drops it
    assert decided(algorithm="fedem", hp={"num_clusters": 2, "drop_last": False}) == (False, False)


@pytest.mark.parametrize("algorithm", ["ifca", "fesem", "cfl"])
def test_asking_by_the_config_key_or_by_the_algorithms_hp_trains_the_same(tmp_path, algorithm):
    hp = {"cfl": {"eps1": 10.0, "eps2": 0.0}}.get(algorithm, {"num_clusters": 2})
    # 7 clients of a 600-sample set at batch 32: most keep a last partial batch to drop
    base = dict(algorithm=algorithm, num_clients=7, batch_size=32, rounds=2)
    by_hp = small_config(tmp_path / "hp", **base, hp={**hp, "drop_last": True})
    by_key = small_config(tmp_path / "key", **base, hp=hp, drop_last=True)
    kept = small_config(tmp_path / "kept", **base, hp=hp)
    assert by_hp.run_id() != by_key.run_id()  # two settings as written, one way of training
    a, b, c = run_metrics(by_hp), run_metrics(by_key), run_metrics(kept)
    assert a.equals(b)
    assert not a.equals(c)  # and it drops something


def test_the_stacks_of_a_pack_keep_runs_that_drop_their_last_batches_apart(tmp_path):
    from fedray.engine.choice import stack_key

    cfg = from_dict(dataclasses.asdict(small_config(tmp_path, algorithm="ifca", hp={"num_clusters": 2})))
    dropping = dataclasses.replace(cfg, hp={"num_clusters": 2, "drop_last": True})
    spec = type("Spec", (), {"augment": None})()
    assert stack_key(task_for(cfg, spec)) != stack_key(task_for(dropping, spec))
