"""An algorithm's check reads the run through `RunPlan` (``check_run(run, hp)``), built from the
checked config and the dataset's info; a plug-in's ``check_config(cfg, hp)`` from before still runs
on the whole config, and says once that it is deprecated."""

from __future__ import annotations

import dataclasses

import pytest

import fedray
from fedray.algorithms import ALGORITHMS
from fedray.config.keys import FIELDS, ConfigError
from fedray.experiment.checks import from_dict, run_plan


def test_a_run_plan_is_the_configs_values_and_the_datasets_shape():
    cfg = from_dict({"algorithm": "cfl", "num_clients": 8, "rounds": 12, "partition": "iid", "model": "mlp"})
    plan = run_plan(cfg, fedray.DatasetInfo((1, 8, 8), 10, 1257))
    for f in dataclasses.fields(fedray.RunPlan):
        if f.name not in ("input_shape", "num_classes"):
            assert f.name in FIELDS and getattr(plan, f.name) == getattr(cfg, f.name), f.name
    assert plan.input_shape == (1, 8, 8) and plan.num_classes == 10
    # the MLP's two hidden layers of 200 and its head, by hand: 64*200+200 + 200*200+200 + 200*10+10
    assert plan.trainable_values() == 55_210
    assert dataclasses.replace(plan, head_bias=False).trainable_values() == 55_200
    with pytest.raises(AttributeError, match=r"'lr' is not in an algorithm's view of the run"):
        getattr(plan, "lr")  # noqa: B009


def test_the_builtin_checks_read_the_plan(monkeypatch):
    seen = []
    real = ALGORITHMS["fedcat"].check_run

    def spy(run, hp):
        seen.append(run)
        return real(run, hp)

    monkeypatch.setitem(ALGORITHMS, "fedcat", dataclasses.replace(ALGORITHMS["fedcat"], check_run=spy))
    with pytest.raises(ConfigError, match=r"config key 'rounds': FedCat aggregates .* Set rounds: 12"):
        from_dict({"algorithm": "fedcat", "num_clients": 8, "participation": 0.5, "rounds": 10})
    assert len(seen) == 1 and isinstance(seen[0], fedray.RunPlan) and seen[0].participation == 0.5


def test_a_plugins_check_config_of_the_whole_config_still_runs_and_says_once_it_is_deprecated(
    monkeypatch, capsys
):
    given = []

    def check_config(cfg, hp):
        given.append(cfg)
        if cfg.lr > 1:  # a key no plan holds: it has the whole config
            raise ValueError("config key 'lr': old_style takes lr <= 1")

    record = dataclasses.replace(
        ALGORITHMS["fedavg"], name="old_style", check_run=None, check_config=check_config
    )
    monkeypatch.setitem(ALGORITHMS, "old_style", record)
    from_dict({"algorithm": "old_style"})
    with pytest.raises(ConfigError, match=r"^config key 'lr': old_style takes lr <= 1$"):
        from_dict({"algorithm": "old_style", "lr": 2.0})
    assert [type(c).__name__ for c in given] == ["Config", "Config"]
    err = capsys.readouterr().err
    assert err.count("check_config(cfg, hp) reads the whole config and is deprecated") == 1, err
    assert "algorithm old_style" in err and "check_run(run, hp)" in err
    # a record made from a built-in's that adds an old check keeps the built-in's too
    both = dataclasses.replace(ALGORITHMS["fedavg"], name="old_style_too", check_config=check_config)
    monkeypatch.setitem(ALGORITHMS, "old_style_too", both)
    with pytest.raises(ConfigError, match=r"^config key 'lr': old_style takes lr <= 1$"):
        from_dict({"algorithm": "old_style_too", "lr": 2.0})
    with pytest.raises(ConfigError, match=r"hp.stragglers: a straggler runs 1..E-1 local epochs"):
        from_dict({"algorithm": "old_style_too", "local_epochs": 1, "hp": {"stragglers": 0.5}})
