"""FedEM and FedRC: the reductions (FedRC's round 0 and FedRC without its prior are FedEM, bit for
bit), the client's mixture state, removal, and the config checks. The E/M arithmetic itself is
tested by hand in test_mixture.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from analysis import load_assignments
from fedray.algorithms import ALGORITHMS
from fedray.algorithms.mixture import client as mixture_client
from fedray.algorithms.mixture import fedrc
from fedray.algorithms.mixture.fedem import MixtureAverage
from fedray.config.keys import ConfigError
from fedray.data import build_federated_data
from fedray.experiment.local import make_local_federation
from tests.conftest import small_config
from tests.helpers import run_metrics as all_metrics


def metrics(cfg):
    """Every metric but the bytes sent down (FedRC's message carries its prior and options too)."""
    df = all_metrics(cfg)
    return df[df["metric"] != "bytes_down"].reset_index(drop=True)


OVER = dict(
    partition="dominant",
    partition_clusters=2,
    num_clients=6,
    rounds=3,
    participation=1.0,
    client_test_fraction=0.2,
    seed=3,
    lr=0.1,
)


def test_fedrc_without_its_label_prior_is_fedem(tmp_path):
    ref = metrics(small_config(tmp_path / "fedem", algorithm="fedem", hp={"num_clusters": 2}, **OVER))
    got = metrics(
        small_config(
            tmp_path / "fedrc", algorithm="fedrc", hp={"num_clusters": 2, "label_prior": False}, **OVER
        )
    )
    assert got.equals(ref), got.compare(ref)


def test_fedrc_round_0_uses_a_constant_prior_so_it_is_fedems_round(tmp_path):
    ref = metrics(small_config(tmp_path / "fedem", algorithm="fedem", hp={"num_clusters": 2}, **OVER))
    got = metrics(small_config(tmp_path / "fedrc", algorithm="fedrc", hp={"num_clusters": 2}, **OVER))
    first = lambda df: df[df["round"] == 1].reset_index(drop=True)  # noqa: E731
    assert first(got).equals(first(ref))
    assert not got[got["round"] == 3]["value"].equals(ref[ref["round"] == 3]["value"].reset_index(drop=True))


@pytest.mark.parametrize("algorithm", ["fedem", "fedrc"])
def test_the_e_step_reads_the_losses_the_last_evaluation_found_with_the_same_numbers(
    tmp_path, monkeypatch, algorithm
):
    """Every client in every round: the evaluation's ensemble on the training splits keeps each
    model's per-sample losses, and the next round's E-step reads them instead of evaluating the same
    models on the same split again. The numbers are those of evaluating again, bit for bit."""
    from fedray.algorithms.mixture import ensemble
    from fedray.engine import drive

    loss_passes = []
    counted = drive.evaluate_requests

    def counting(clients, evals, stack_models=False):
        loss_passes.extend(e for e in evals if e.per_sample == "loss")
        return counted(clients, evals, stack_models)

    monkeypatch.setattr(drive, "evaluate_requests", counting)
    hp = {"num_clusters": 2}
    kept = metrics(small_config(tmp_path / "kept", algorithm=algorithm, hp=hp, **OVER))
    assert len(loss_passes) == 6 * 2  # round 0's E-step only: 6 clients, 2 models
    evaluate = ensemble.evaluate
    monkeypatch.setattr(ensemble, "evaluate", lambda fed, live, hard, rnd=None: evaluate(fed, live, hard))
    loss_passes.clear()
    again = metrics(small_config(tmp_path / "again", algorithm=algorithm, hp=hp, **OVER))
    assert len(loss_passes) == 3 * 6 * 2  # every round's E-step
    numbers = lambda df: df[~df["metric"].str.contains("seconds")].reset_index(drop=True)  # noqa: E731
    assert numbers(kept).equals(numbers(again)), numbers(kept).compare(numbers(again))


def test_clients_that_kept_losses_train_in_one_stack_with_those_that_evaluate_again(tmp_path, monkeypatch):
    """Stacked clients, only some evaluated (eval_clients): the others evaluate again in the next
    E-step, and every client's updates still train in the one stack they would without kept losses."""
    from fedray.algorithms.mixture import ensemble
    from fedray.engine import batched

    stacks = []
    stacked = batched.train_stacked

    def recording(clients, updates, fixed=None, options=None):
        stacks.append(sorted(c.cid for c in clients))
        return stacked(clients, updates, fixed, options)

    monkeypatch.setattr(batched, "train_stacked", recording)
    over = {**OVER, "batched_clients": "on", "eval_clients": 3}
    kept = metrics(small_config(tmp_path / "kept", algorithm="fedrc", hp={"num_clusters": 2}, **over))
    kept_stacks, stacks[:] = list(stacks), []
    evaluate = ensemble.evaluate
    monkeypatch.setattr(ensemble, "evaluate", lambda fed, live, hard, rnd=None: evaluate(fed, live, hard))
    again = metrics(small_config(tmp_path / "again", algorithm="fedrc", hp={"num_clusters": 2}, **over))
    assert kept_stacks == stacks and len(stacks) == 3 and all(len(s) == 12 for s in stacks)
    numbers = lambda df: df[~df["metric"].str.contains("seconds")].reset_index(drop=True)  # noqa: E731
    assert numbers(kept).equals(numbers(again)), numbers(kept).compare(numbers(again))


def test_a_client_that_missed_the_evaluation_or_whose_models_changed_evaluates_again():
    state = mixture_client.fresh([0, 1], 3)
    kept = np.array([[0.5, 1.0, 2.0], [2.0, 1.0, 0.5]])
    state = mixture_client.ClientMixture(state.ids, state.gamma, state.omega, next_losses=kept, next_round=4)
    models = [{"w": np.zeros(1)}, {"w": np.ones(1)}]

    def e_step(state, msg):
        client = SimpleNamespace(train_labels=lambda: np.array([0, 1, 0]))
        gen = mixture_client.e_step(client, state, models, msg)
        return gen, next(gen)

    # the round it was kept for: read, and dropped; an empty step where the evaluation would be
    gen, asked = e_step(state, {"round": 4})
    assert asked == []
    with pytest.raises(StopIteration) as done:
        gen.send([])
    got = done.value.value
    assert got.next_losses is None and got.next_round == -1
    assert np.array_equal(got.gamma, mixture_client.mixture.e_step(kept, state.omega, None, None))
    for msg in ({"round": 5}, {}):  # another round (it missed an evaluation), a test client's E-step
        _, asked = e_step(state, msg)
        assert [e.per_sample for e in asked] == ["loss", "loss"]


def test_the_label_prior_is_built_from_every_clients_last_statistics(tmp_path):
    cfg = small_config(tmp_path, algorithm="fedrc", hp={"num_clusters": 2}, **{**OVER, "participation": 0.5})
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    hp = ALGORITHMS["fedrc"].make_hparams(cfg.hp)
    s = fedrc.init(fed, hp)
    assert s.prior is None  # round 0: constant prior, FedEM's E-step
    s1, _ = fedrc.round(s, fed, hp, 0)
    reported = sorted(s1.stats)
    assert len(reported) == 3  # the participants; the others still count with 1/C per class
    c = fed.task.spec.num_classes
    total = sum(s1.stats[k] for k in reported) + 3 * np.full((2, c), 1.0 / c)
    np.testing.assert_allclose(
        s1.prior, np.maximum(total, 1e-8) / np.maximum(total, 1e-8).sum(axis=1, keepdims=True)
    )
    # each participant's statistics sum to its number of training samples (gamma sums to 1 per sample)
    n = fed.num_examples()
    for k in reported:
        assert s1.stats[k].sum() == pytest.approx(n[k])


def test_client_state_keeps_gamma_and_omega_and_drops_removed_models():
    st = mixture_client.fresh([0, 1, 2], 4)
    np.testing.assert_allclose(st.omega, 1 / 3)
    st.gamma = np.array([[0.5, 0.2, 0.1, 0.4], [0.3, 0.0, 0.1, 0.2], [0.2, 0.8, 0.8, 0.4]])
    st.opt = {0: {"x": np.zeros(1)}, 1: {"x": np.ones(1)}}
    same = mixture_client.aligned(st, [0, 1, 2], 4)
    assert same is st
    kept = mixture_client.aligned(st, [0, 2], 4)  # model 1 removed by the server
    np.testing.assert_allclose(kept.gamma.sum(axis=0), 1.0)
    np.testing.assert_allclose(kept.gamma[:, 0], [0.5 / 0.7, 0.2 / 0.7])
    np.testing.assert_allclose(kept.omega, kept.gamma.mean(axis=1))
    assert kept.ids == [0, 2] and sorted(kept.opt) == [0]


def test_removal_waits_for_converged_shares_then_drops_a_model_everywhere(tmp_path):
    # App. F: removal once gamma has converged. Round 0 has no previous shares, so nothing goes; with
    # removal_tol 1 any later round counts as converged, with a tiny one none does.
    cfg = small_config(
        tmp_path, algorithm="fedrc", hp={"num_clusters": 3, "delta": 0.34, "removal_tol": 1.0}, **OVER
    )
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    hp = ALGORITHMS["fedrc"].make_hparams(cfg.hp)
    s = fedrc.init(fed, hp)
    s1, records = fedrc.round(s, fed, hp, 0)
    assert not [r for r in records if r.get("metric") == "removed"] and len(s1.models) == 3
    assert s1.shares.sum() == pytest.approx(1.0) and len(s1.shares) == 3
    strict = ALGORITHMS["fedrc"].make_hparams({**cfg.hp, "removal_tol": 1e-12})
    _, records = fedrc.round(s1, fed, strict, 1)
    assert not [r for r in records if r.get("metric") == "removed"]  # the shares still move
    s2, records = fedrc.round(s1, fed, hp, 1)
    removed = [r["entity"] for r in records if r.get("metric") == "removed"]
    assert removed and len(s2.models) == 3 - len(removed) and s2.prior.shape[0] == len(s2.models)
    assert all(st.shape[0] == len(s2.models) for st in s2.stats.values()) and s2.shares is None
    s3, _ = fedrc.round(s2, fed, hp, 2)  # clients drop the removed rows on the next message
    omegas = fed.map(mixture_client.report_omega, fed.client_ids, {"ids": sorted(s3.models)})
    assert all(len(o) == len(s3.models) and o.sum() == pytest.approx(1.0) for o in omegas.values())


def test_omega_of_every_participant_is_written_each_round(tmp_path):
    from fedray.experiment.loop import execute

    cfg = small_config(tmp_path, algorithm="fedrc", hp={"num_clusters": 2}, **OVER)
    list(execute(cfg, make_local_federation))
    a = load_assignments(cfg.output)
    assert len(a) == 3 * 6 * 2  # rounds x clients x models
    np.testing.assert_allclose(a.groupby(["round", "client"])["weight"].sum(), 1.0)


@pytest.mark.parametrize(
    "hp, match",
    [
        ({"adam": "yes"}, r"'hp.adam'.*off, paper, code"),
        ({"delta": 1.5}, r"'hp.delta'"),
        ({"xi": -1}, r"'hp.xi'"),
        ({"num_clusters": 0}, r"'hp.num_clusters'"),
    ],
)
def test_bad_fedrc_settings_name_the_key(tmp_path, hp, match):
    with pytest.raises(ConfigError, match=match):
        small_config(tmp_path, algorithm="fedrc", hp=hp)


def test_every_sampled_client_enters_each_models_average_a_skipper_with_what_it_received():
    # Algorithm 1, line 11 (and the FedRC code): theta_k = sum_i n_i theta_ik / sum_i n_i over the
    # sampled clients; client A (n = 1) skipped model 1 (omega = 0), so it brings the received model.
    received = {0: {"w": np.array([0.0, 0.0])}, 1: {"w": np.array([10.0, 10.0])}}
    agg = MixtureAverage(received)
    agg.add([{"w": np.array([1.0, 2.0])}, None], 1)  # client A
    agg.add([{"w": np.array([3.0, 6.0])}, {"w": np.array([2.0, 6.0])}], 3)  # client B
    out = agg.result()
    np.testing.assert_allclose(out[0]["w"], [(1 * 1 + 3 * 3) / 4, (1 * 2 + 3 * 6) / 4])  # [2.5, 5]
    # [4, 7], not B's [2, 6]
    np.testing.assert_allclose(out[1]["w"], [(1 * 10 + 3 * 2) / 4, (1 * 10 + 3 * 6) / 4])
    assert agg.trained == {0: 2, 1: 1}
