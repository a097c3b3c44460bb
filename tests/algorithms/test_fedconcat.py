"""FedConcat and FedConcat-ID: reduces to FedAvg, label inference, eq. F6 communication, the stages."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import load_assignments, load_metrics
from fedray.algorithms import ALGORITHMS
from fedray.algorithms.concat import classifier as concat
from fedray.algorithms.concat import fedconcat_id
from fedray.config.keys import ConfigError
from fedray.data import build_federated_data
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import execute
from fedray.params import get_params
from tests.conftest import small_config
from tests.helpers import TIMING, encoder_params, num_parameters


def run(cfg):
    list(execute(cfg, make_local_federation))
    return load_metrics(cfg.output)


def tidy(df):
    cols = ["round", "metric", "scope", "entity", "value"]
    return df[~df["metric"].isin(TIMING)].sort_values(cols[:4]).reset_index(drop=True)[cols]


def test_one_cluster_and_no_classifier_stage_is_fedavg_exactly(tmp_path):
    over = dict(participation=0.5, rounds=3, seed=2, client_test_fraction=0.2)
    fedavg = tidy(run(small_config(tmp_path / "a", **over)))
    hp = {"num_clusters": 1, "encoder_rounds": 3, "classifier_rounds": 0}
    fc = run(small_config(tmp_path / "b", algorithm="fedconcat", hp=hp, **over))
    assert set(fc["stage"]) == {"encoder"}
    # The single cluster's model is FedAvg's global model: its rows, relabelled, are FedAvg's rows.
    cluster0 = (fc["scope"] == "cluster") & (fc["entity"] == 0) & fc["metric"].isin(["accuracy", "loss"])
    fc.loc[cluster0, ["scope", "entity"]] = ["global", -1]
    extra = {"num_clusters", "cluster_size", "member_accuracy"}
    fc = fc[
        ~fc["metric"].isin(extra)
        & ~((fc["scope"] == "cluster") & fc["metric"].isin(["participants", "local_accuracy"]))
    ]
    assert tidy(fc).equals(fedavg)  # every value exact: accuracy, losses, local accuracies, bytes


def test_fedconcat_id_ranks_a_skewed_clients_majority_classes_first(tmp_path):
    cfg = small_config(
        tmp_path,
        dataset="digits",
        num_clients=10,
        partition="labels",
        partition_k=2,
        local_epochs=5,
        algorithm="fedconcat_id",
        rounds=1,
        hp={"num_clusters": 5, "encoder_rounds": 1, "classifier_rounds": 0, "random_inputs": 2000},
    )
    data = build_federated_data(cfg)
    fed, _ = make_local_federation(cfg, data)
    replies = fed.map(
        fedconcat_id.train_and_infer,
        fed.client_ids,
        {"params": get_params(fed.task.build_model()), "round": 0, "random_inputs": 2000},
    )
    for c, r in replies.items():
        counts = fed.label_counts([c])[c]
        mine = set(np.flatnonzero(counts))
        assert len(mine) == 2
        assert set(np.argsort(r["inferred"])[-2:]) == mine, (c, r["inferred"].round(3), counts)
        assert r["inferred"].sum() == pytest.approx(1.0)
        assert "inference_l1" not in r  # the reply says nothing about the client's labels
    # the whole algorithm: two clients share a label pair -> most pairs land in one cluster
    list(execute(cfg, make_local_federation))
    m = load_metrics(cfg.output)
    l1 = m[(m["metric"] == "inference_l1") & (m["scope"] == "global")]["value"].item()
    assert l1 < 1.0  # inferred distributions are closer to the truth than a wrong guess (L1 up to 2)
    per_client = m[(m["metric"] == "inference_l1") & (m["scope"] == "client")].set_index("entity")["value"]
    for c, r in replies.items():  # the simulator's diagnostic: |inferred - true distribution|_1
        truth = fed.label_counts([c])[c] / fed.label_counts([c])[c].sum()
        assert per_client[c] == pytest.approx(np.abs(r["inferred"] - truth).sum(), abs=1e-12)
    assert set(load_assignments(cfg.output)["cluster"]) <= set(range(5))


def test_fedconcat_id_round_0_is_encoder_round_0_and_seeds_each_cluster_with_its_members_average(tmp_path):
    # docs/algorithms/fedconcat.md#d6-fedconcat-ids-inference-round-is-encoder-round-0: every client (participation says 0.5) trains the shared init once; each cluster
    # model is the data-size-weighted average of its members' round-0 models; T_e - 1 rounds follow.
    cfg = small_config(
        tmp_path,
        dataset="digits",
        num_clients=8,
        partition="labels",
        partition_k=2,
        algorithm="fedconcat_id",
        rounds=3,
        participation=0.5,
        hp={"num_clusters": 3, "encoder_rounds": 2, "random_inputs": 500},
    )
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    hp = ALGORITHMS["fedconcat_id"].make_hparams(cfg.hp)
    state = fedconcat_id.init(fed, hp)
    msg = {"params": state.init, "round": 0, "random_inputs": hp.random_inputs}
    replies = fed.map(fedconcat_id.train_and_infer, fed.client_ids, msg)  # what round 0 must collect
    after, records = fedconcat_id.round(state, fed, hp, 0)
    assert sorted(after.assignment) == fed.client_ids  # every client took part
    n = fed.num_examples()
    for k, model in enumerate(after.models):
        members = [c for c in fed.client_ids if after.assignment[c] == k]
        if not members:
            continue
        for key in model:
            expect = sum(n[c] * replies[c]["params"][key].astype(np.float64) for c in members) / sum(
                n[c] for c in members
            )
            np.testing.assert_allclose(model[key], expect, rtol=1e-6, atol=1e-7)
    assert after.stage == "encoder"  # round 1 is the second and last encoder round
    list(execute(cfg, make_local_federation))
    m = load_metrics(cfg.output)
    assert m.groupby("stage")["round"].agg(["min", "max"]).to_dict("index") == {
        "encoder": {"min": 1, "max": 2},
        "classifier": {"min": 3, "max": 3},
    }


def f6_units(out: str, model_bytes: int) -> pd.Series:
    m = load_metrics(out)
    m = m[m["metric"].isin(["bytes_down", "bytes_up"])]
    return m.groupby("stage")["value"].sum() / model_bytes


def test_communication_per_client_follows_eq_f6(tmp_path):
    """F6: per client, 2 T_e + K + 2 c K T_c model units (full participation), c = classifier / model."""
    from fedray.params import payload_nbytes

    n, k, te, tc = 6, 2, 3, 4
    cfg = small_config(
        tmp_path, algorithm="fedconcat", rounds=te + tc, hp={"num_clusters": k, "encoder_rounds": te}
    )
    list(execute(cfg, make_local_federation))
    model = get_params(make_local_federation(cfg, build_federated_data(cfg))[0].task.build_model())
    w = payload_nbytes(model)
    c = (num_parameters(model) - num_parameters(encoder_params(model))) / num_parameters(model)
    units = f6_units(cfg.output, w) / n
    assert units["encoder"] == pytest.approx(2 * te, rel=0.01)
    # the K encoders once (as whole cluster models, as F6 counts them), then 2 c K per round
    assert units["classifier"] == pytest.approx(k + 2 * c * k * tc, rel=0.02)
    assert units.sum() == pytest.approx(2 * te + k + 2 * c * k * tc, rel=0.01)


def test_every_row_carries_its_stage_and_the_classifier_starts_after_the_encoders(tmp_path):
    cfg = small_config(
        tmp_path, algorithm="fedconcat", rounds=5, eval_every=10, hp={"num_clusters": 2, "encoder_rounds": 2}
    )
    m = run(cfg)
    assert (m[m["round"] <= 2]["stage"] == "encoder").all() and (
        m[m["round"] > 2]["stage"] == "classifier"
    ).all()
    evaluated = sorted(m[m["metric"] == "eval_seconds"]["round"])
    assert evaluated == [2, 5]  # the end of each stage is evaluated even with eval_every=10
    glob = m[m["scope"] == "global"]
    assert "accuracy" not in set(glob[glob["stage"] == "encoder"]["metric"])  # no global model yet
    member = m[(m["metric"] == "member_accuracy") & (m["scope"] == "cluster")]
    assert sorted(member["entity"]) == [0, 1] and set(member["round"]) == {2}
    assert set(m[m["metric"] == "participants"][lambda d: d["scope"] == "global"]["round"]) == {1, 2, 3, 4, 5}


def test_cached_features_give_the_numbers_of_recomputing_them(tmp_path):
    hp = {"num_clusters": 2, "encoder_rounds": 2}
    a = run(small_config(tmp_path / "a", algorithm="fedconcat", rounds=5, hp=hp))
    b = run(small_config(tmp_path / "b", algorithm="fedconcat", rounds=5, hp={**hp, "cache_features": False}))
    ta, tb = tidy(a), tidy(b)
    traffic = ta["metric"].isin(["bytes_down", "bytes_up"])
    assert ta[~traffic][["round", "metric", "scope", "entity"]].equals(
        tb[~traffic][["round", "metric", "scope", "entity"]]
    )
    np.testing.assert_allclose(ta[~traffic]["value"], tb[~traffic]["value"], rtol=1e-5, atol=1e-6)


def test_options_balanced_dp_elbow_and_classifier_init_run_and_are_recorded(tmp_path):
    hp = {
        "num_clusters": 2,
        "encoder_rounds": 1,
        "balanced": True,
        "eps": 2.5,
        "elbow_range": [1, 4],
        "init_from_clusters": True,
    }
    m = run(small_config(tmp_path, algorithm="fedconcat", rounds=3, hp=hp))
    k = int(m[m["metric"] == "num_clusters"]["value"].item())
    assert 1 <= k <= 4 and sorted(m[m["metric"] == "elbow_inertia"]["entity"]) == [1, 2, 3, 4]
    sizes = m[m["metric"] == "cluster_size"]["value"]
    assert sizes.sum() == 6 and sizes.max() <= max(int(1.2 * 6 / k), -(-6 // k))  # the balanced cap


@pytest.mark.parametrize(
    "over, pattern",
    [
        (
            dict(rounds=10, hp={"encoder_rounds": 31}),
            r"'rounds': fedconcat runs hp.encoder_rounds=31 .* Set rounds: 231",
        ),
        (
            dict(rounds=50, hp={"encoder_rounds": 31, "classifier_rounds": 200}),
            r"31 \+ 200 = 231 rounds, but rounds is 50; set rounds: 231",
        ),
        (
            dict(rounds=10, hp={"encoder_rounds": 2, "num_clusters": 7}),
            r"hp.num_clusters': 7 clusters but only 6",
        ),
        (
            dict(rounds=10, hp={"encoder_rounds": 2, "elbow_range": [3, 2]}),
            r"hp.elbow_range': must be \[lo, hi\]",
        ),
        (
            dict(rounds=10, hp={"encoder_rounds": 2, "clustering": "cfl"}),
            r"hp.clustering': must be one of kmeans, ifca, fesem, fedsoft",
        ),
        (
            dict(rounds=10, algorithm="fedconcat_id", hp={"encoder_rounds": 2, "eps": 1.0}),
            r"hp.eps': FedConcat-ID sends no",
        ),
        (
            dict(rounds=10, algorithm="fedconcat_id", hp={"encoder_rounds": 2, "clustering": "ifca"}),
            r"hp.clustering': FedConcat-ID clusters the inferred distributions by K-means .* got 'ifca'",
        ),
    ],
)
def test_config_errors_name_the_keys(tmp_path, over, pattern):
    with pytest.raises(ConfigError, match=pattern):
        small_config(tmp_path, **{"algorithm": "fedconcat", **over})


def test_registered_with_their_hparams():
    assert {"fedconcat", "fedconcat_id", "clusterfedavg"} <= set(ALGORITHMS)
    hp = ALGORITHMS["fedconcat_id"].make_hparams({"num_clusters": 3})
    assert hp.random_inputs == 10_000 and hp.classifier_steps == 3 and hp.encoder_rounds == 31


def test_the_classifier_is_the_unweighted_mean_of_the_participants_heads(tmp_path):
    """Register docs/algorithms/fedconcat.md#d2-three-classifier-steps-averaged-without-weights: every client takes the same 3 steps, so the server averages without weights."""
    from fedray.algorithms.concat import fedconcat

    cfg = small_config(
        tmp_path,
        algorithm="fedconcat",
        rounds=2,
        partition="quantity",
        partition_beta=0.3,
        hp={"num_clusters": 2, "encoder_rounds": 1},
    )
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    sizes = fed.num_examples()
    assert len(set(sizes.values())) > 1  # clients of different sizes: a weighted mean would differ
    hp = ALGORITHMS["fedconcat"].make_hparams(cfg.hp)
    state, _ = fedconcat.round(fedconcat.init(fed, hp), fed, hp, 0)
    before = state.head
    # the first classifier round: encoders sent, head trained
    state, records = fedconcat.round(state, fed, hp, 1)
    # Each client's own update from the round's starting head, as the clients computed it:
    start = get_params(fed.task.build_model("classifier_init", fedconcat.Arch(2, head_only=True)))
    assert before is None
    msg = {"head": start, "round": 1, "k": 2, "steps": 3}
    heads = fed.map(concat.classifier_update, fed.client_ids, msg)
    for name in ("weight", "bias"):
        by_hand = np.mean([heads[c]["params"][name].astype(np.float64) for c in sorted(heads)], axis=0)
        np.testing.assert_allclose(state.head[name], by_hand.astype(np.float32), rtol=0, atol=1e-7)
        weighted = np.average(
            [heads[c]["params"][name] for c in sorted(heads)],
            axis=0,
            weights=[sizes[c] for c in sorted(heads)],
        )
        assert not np.allclose(state.head[name], weighted, atol=1e-6)
    assert all(heads[c]["steps"] == min(3, -(-sizes[c] // 32)) for c in heads)


def test_dp_noise_is_added_by_each_client_so_the_server_sees_only_noised_distributions(tmp_path):
    from fedray.algorithms.clustered.groups import reported_distributions
    from fedray.algorithms.clustering import label_distributions

    cfg = small_config(tmp_path, algorithm="fedconcat", rounds=2, hp={"num_clusters": 2, "encoder_rounds": 1})
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    counts = fed.label_counts()
    exact = dict(zip(sorted(counts), label_distributions(counts), strict=True))
    fed.take_traffic()
    assert all(np.array_equal(v, exact[c]) for c, v in reported_distributions(fed).items())  # eps = 0
    _, up, _ = fed.take_traffic()
    assert up > 0  # the distributions travel, and are counted
    noised = reported_distributions(fed, eps=2.5)
    for c, v in noised.items():  # F3 on the client, from the client's own stream: Laplace(0, 1/eps)
        expect = exact[c] + fed.task.rng("dp_noise", c).laplace(0.0, 1 / 2.5, size=len(v))
        np.testing.assert_array_equal(v, expect)
    again = reported_distributions(fed, eps=2.5)
    assert all(np.array_equal(noised[c], v) for c, v in again.items())  # seeded: the same noise every call


@pytest.mark.parametrize("clustering", ["ifca", "fesem", "fedsoft"])
def test_a_clustered_algorithm_can_run_stage_2_and_its_models_become_the_encoders(tmp_path, clustering):
    cfg = small_config(
        tmp_path,
        algorithm="fedconcat",
        rounds=3,
        partition="dominant",
        partition_clusters=2,
        client_test_fraction=0.2,
        hp={"num_clusters": 2, "encoder_rounds": 2, "clustering": clustering},
    )
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    alg = ALGORITHMS["fedconcat"]
    hp = alg.make_hparams(cfg.hp)
    state = alg.init(fed, hp)
    for rnd in range(2):
        state, records = alg.round(state, fed, hp, rnd)
        assert {r["stage"] for r in records} == {"encoder"}
    assert state.models == state.inner.models and len(state.models) == 2
    assert set(state.assignment) <= set(fed.client_ids) and set(state.assignment.values()) <= {0, 1}
    state, _ = alg.round(state, fed, hp, 2)  # the classifier over the two encoders
    assert state.stage == "classifier" and state.head is not None
    m = run(cfg)
    assert {"encoder", "classifier"} == set(m["stage"]) and "purity" in set(
        m[m["stage"] == "encoder"]["metric"]
    )


def test_fedconcat_ifca_with_one_cluster_trains_fedconcats_encoder(tmp_path):
    over = dict(participation=0.5, rounds=2, seed=2, client_test_fraction=0.2)
    hp = {"num_clusters": 1, "encoder_rounds": 2, "classifier_rounds": 0}
    a = run(small_config(tmp_path / "a", algorithm="fedconcat", hp=hp, **over))
    b = run(small_config(tmp_path / "b", algorithm="fedconcat", hp={**hp, "clustering": "ifca"}, **over))
    for name in ("train_loss", "train_accuracy", "sgd_loss", "sgd_accuracy"):
        assert a[a["metric"] == name]["value"].tolist() == b[b["metric"] == name]["value"].tolist()
    pick = lambda d: d[(d["metric"] == "accuracy") & (d["scope"] == "cluster")]["value"].tolist()  # noqa: E731
    assert pick(a) == pick(b) and len(pick(a)) == 2


def test_the_classifier_trains_on_the_features_of_the_encoders_stage_2_trained(tmp_path):
    # One client, one cluster, one encoder round, then one classifier step over the client's whole
    # split (one batch), fresh SGD (momentum's first step is the gradient), no weight decay: the head
    # moves by -lr * grad, grad worked out by hand from the trained encoder's features h:
    #   W' = W - lr * (softmax(W h + b) - onehot(y))^T h / B,   b' = b - lr * mean(softmax(.) - onehot(y)).
    import torch

    from fedray.models import Arch

    hp = {"num_clusters": 1, "encoder_rounds": 1, "classifier_rounds": 1, "classifier_steps": 1}
    cfg = small_config(
        tmp_path,
        num_clients=1,
        algorithm="fedconcat",
        rounds=2,
        batch_size=1000,
        lr=0.5,
        weight_decay=0.0,
        hp=hp,
    )
    data = build_federated_data(cfg)
    fed, _ = make_local_federation(cfg, data)
    alg = ALGORITHMS["fedconcat"]
    h = alg.make_hparams(cfg.hp)
    state = alg.init(fed, h)
    state, _ = alg.round(state, fed, h, 0)
    trained = state.models[0]
    assert any(not np.array_equal(trained[k], state.init[k]) for k in trained)  # stage 2 moved the encoder
    head0 = get_params(fed.task.build_model("classifier_init", Arch(1, head_only=True)))
    idx = data.clients[0].train
    x = data.dataset.spec.to_tensor(data.dataset.train.x[idx])
    y = data.dataset.train.y[idx]

    def by_hand(encoder_params):
        net = fed.task.build_model()
        net.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in encoder_params.items()})
        with torch.no_grad():
            feats = net.encoder(x).double().numpy()
        w, b = head0["weight"].astype(np.float64), head0["bias"].astype(np.float64)
        z = feats @ w.T + b
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = (p - np.eye(10)[y]) / len(y)
        return w - cfg.lr * g.T @ feats, b - cfg.lr * g.sum(0)

    state, _ = alg.round(state, fed, h, 1)
    w1, b1 = by_hand(trained)
    np.testing.assert_allclose(state.head["weight"], w1, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state.head["bias"], b1, rtol=1e-4, atol=1e-6)
    # ... which the untrained encoders' features would not give.
    w0, _ = by_hand(state.init)
    assert np.abs(w0 - w1).max() > 100 * np.abs(state.head["weight"] - w1).max()


def at_stage_3(tmp_path, cache):
    """A local federation with FedConcat in stage 3 (two encoders, one classifier round done)."""
    hp = {"num_clusters": 2, "encoder_rounds": 1, "cache_features": cache}
    cfg = small_config(tmp_path, algorithm="fedconcat", rounds=3, eval_batch_size=7, hp=hp)
    fed, _ = make_local_federation(cfg, build_federated_data(cfg))
    alg = ALGORITHMS["fedconcat"]
    h = alg.make_hparams(cfg.hp)
    state = alg.init(fed, h)
    for rnd in range(2):
        state, _ = alg.round(state, fed, h, rnd)
    return fed, alg, h, state


@pytest.mark.parametrize("cache", [True, False])
def test_stage_3_train_accuracy_from_the_kept_features_is_the_whole_models_bit_for_bit(tmp_path, cache):
    # Stage 3's train_accuracy runs the classifier on the features each client kept (the encoders are
    # frozen), not its images through K encoders every round: the same numbers as the whole
    # concatenated model on the images, exactly.
    from fedray.algorithms.evaluation import member_eval, model_msg
    from fedray.models import Arch, concat_params

    fed, alg, h, state = at_stage_3(tmp_path, cache)
    k = len(state.models)
    whole = fed.map(member_eval, fed.client_ids, model_msg(concat_params(state.models, state.head), Arch(k)))
    kept = fed.map(concat.train_split_eval, fed.client_ids, {"head": state.head, "k": k})
    assert kept == whole
    assert sum(r["samples"] for r in kept.values()) == sum(fed.num_examples().values())
    records = {r["metric"]: r["value"] for r in alg.evaluate(state, fed, h, 1) if r["scope"] == "global"}
    samples = sum(r["samples"] for r in whole.values())
    assert records["train_accuracy"] == sum(r["correct"] for r in whole.values()) / samples
    assert records["train_loss"] == sum(r["loss_sum"] for r in whole.values()) / samples


def test_stage_3_test_accuracy_from_the_kept_test_features_is_the_whole_models_bit_for_bit(
    tmp_path, monkeypatch
):
    # The global test set's features are computed once per set of encoders and kept by the worker;
    # every later evaluation runs the classifier alone and gives the whole model's numbers exactly.
    # New encoders (another digest) are encoded afresh, never served the old features.
    from fedray.algorithms.evaluation import evaluate_global
    from fedray.models import Arch, concat_params

    fed, alg, h, state = at_stage_3(tmp_path, True)
    k = len(state.models)
    encodes = []
    real = concat.encoded
    monkeypatch.setattr(concat, "encoded", lambda *a: encodes.append(1) or real(*a))

    def via_kept(models, head):
        return evaluate_global(fed, {}, test=(concat.test_split_eval, {"head": head, "models": models}))

    whole = evaluate_global(fed, concat_params(state.models, state.head), Arch(k))
    assert via_kept(state.models, state.head) == whole and len(encodes) == 1
    records = {r["metric"]: r["value"] for r in alg.evaluate(state, fed, h, 1) if r["scope"] == "global"}
    assert (records["accuracy"], records["loss"]) == (
        whole.correct / whole.samples,
        whole.loss_sum / whole.samples,
    )
    assert len(encodes) == 1  # the round's evaluation used the kept features
    moved = [{n: (v + 0.5).astype(v.dtype) for n, v in m.items()} for m in state.models]
    moved_whole = evaluate_global(fed, concat_params(moved, state.head), Arch(k))
    assert moved_whole != whole
    assert via_kept(moved, state.head) == moved_whole and len(encodes) == 2
