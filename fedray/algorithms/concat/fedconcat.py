"""FedConcat: Diao, Li, He, "Exploiting Label Skews in Federated Learning with Model Concatenation",
AAAI 2024 (docs/algorithms/fedconcat.md#fedconcat-and-fedconcat-id; reference code sjtudyq/FedConcat).

1. (first round) Cluster the clients by their label distributions P_i (F1; optional Laplace noise,
   F3) with K-means, optionally balanced (F4) or with K chosen by the elbow of the inertia curve.
2. (``encoder_rounds`` rounds, stage ``encoder``) cluster-wise FedAvg, every cluster starting from
   the same random weights, all clusters training in the same round.
3. (the remaining rounds, stage ``classifier``) freeze the K encoders, concatenate them, and train
   one global linear classifier on top by FedAvg: per round each participant takes
   ``classifier_steps`` mini-batch steps (fresh SGD), and the server averages unweighted.

As the reference code (docs/algorithms/fedconcat.md#paper-and-code-differences): identical initial weights for all clusters (docs/algorithms/fedconcat.md#d5-one-initialisation-for-every-cluster); a
cluster with no participant this round is skipped; the classifier averaged without weights (docs/algorithms/fedconcat.md#d2-three-classifier-steps-averaged-without-weights);
K-means as scikit-learn with 10 restarts. fedray's own decisions (features computed once per
client, the encoders sent once, the elbow, the balanced cap, DP noise added by each client):
docs/algorithms/fedconcat.md.

``clustering: ifca | fesem | fedsoft``: stage 2 by that clustered algorithm (`table10.py`).

Records: assignments (round 1); each cluster model's test accuracy in stage 2 and at its end on
its members' data (``member_accuracy``); the concatenated model's ``accuracy`` and
``train_accuracy`` each classifier round (from kept features, bit for bit: `classifier.py`). Rows
carry their stage. The paper's FMNIST number: ``fedray report DIR --stage classifier --round 173``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fedray.algorithms.clustered.groups import one_cluster, reported_distributions, start_clusters
from fedray.algorithms.clustering import Clustering, cluster_vectors
from fedray.algorithms.concat import CLASSIFIER, ENCODER, table10
from fedray.algorithms.concat import classifier as concat
from fedray.algorithms.evaluation import cluster_model_records, single_model_records
from fedray.algorithms.plan import RunPlan
from fedray.algorithms.rounds import clustered_fedavg_round
from fedray.config.hparams import bound, one_of
from fedray.federation import Federation
from fedray.models import Arch, concat_params
from fedray.params import Params, get_params
from fedray.records import Record
from fedray.storage.export import SavedModel, cluster_models, global_model, members_of


@dataclass
class Hparams:
    # K: clusters, hence encoders concatenated (paper: 5)
    num_clusters: int = field(default=5, metadata=bound(ge=1))
    # T_e: rounds of cluster-wise FedAvg (paper Table 1: 31; code default 50)
    encoder_rounds: int = field(default=31, metadata=bound(ge=1))
    # T_c: rounds of global classifier training; None = rounds - encoder_rounds (paper: 200)
    classifier_rounds: int | None = field(default=None, metadata=bound(ge=0))
    # mini-batch steps per participant per classifier round
    classifier_steps: int = field(default=3, metadata=bound(ge=1))
    # DP: Laplace(0, 1/eps) on every entry of the label distributions (F3); 0 = off
    eps: float = field(default=0.0, metadata=bound(ge=0))
    balanced: bool = False  # balanced K-means, no cluster above floor(1.2 N / K) clients (F4)
    init_from_clusters: bool = False  # classifier starts as the cluster heads side by side (F5)
    cache_features: bool = True  # features computed once per client (paper); false: every step (code)
    elbow_range: list[int] = field(default_factory=list)  # [lo, hi]: K by the elbow over lo..hi
    # kmeans (stages 1 and 2 of the paper) | ifca | fesem | fedsoft (stage 2 by that algorithm, Table 10)
    clustering: str = field(default="kmeans", metadata=one_of("kmeans", *table10.CLUSTERED_STAGES))

    def check(self) -> None:
        r = self.elbow_range
        if r and not (len(r) == 2 and 1 <= r[0] <= r[1]):
            raise ValueError(f"config key 'hp.elbow_range': must be [lo, hi] with 1 <= lo <= hi, got {r}")


def rounds_from_hp(hp: Hparams) -> int | None:
    """With both stages' rounds given, the run's rounds are their sum (a config that leaves
    ``rounds`` unset gets it)."""
    return None if hp.classifier_rounds is None else hp.encoder_rounds + hp.classifier_rounds


def check_run(run: RunPlan, hp: Hparams) -> None:
    if not run.head_bias:
        raise ValueError(
            f"config key 'head_bias': {run.algorithm}'s classifier over the concatenated features has a bias "
            "(the paper's and the code's); head_bias: false is for the other algorithms"
        )
    if hp.classifier_rounds is None:
        if run.rounds < hp.encoder_rounds:
            raise ValueError(
                f"config key 'rounds': {run.algorithm} runs hp.encoder_rounds={hp.encoder_rounds} encoder rounds, then "
                f"rounds - encoder_rounds classifier rounds; rounds is {run.rounds}. Set rounds: "
                f"{hp.encoder_rounds + 200} for these encoder rounds and the paper's 200 classifier rounds"
            )
    elif run.rounds != (total := hp.encoder_rounds + hp.classifier_rounds):
        raise ValueError(
            f"config key 'rounds': {run.algorithm} runs hp.encoder_rounds + hp.classifier_rounds = {hp.encoder_rounds} + "
            f"{hp.classifier_rounds} = {total} rounds, but rounds is {run.rounds}; set rounds: {total} "
            "(or leave hp.classifier_rounds unset: it is then rounds - encoder_rounds)"
        )
    k = hp.elbow_range[1] if hp.elbow_range else hp.num_clusters
    if k > run.num_clients:
        key = "hp.elbow_range" if hp.elbow_range else "hp.num_clusters"
        raise ValueError(f"config key '{key}': {k} clusters but only {run.num_clients} clients")


@dataclass
class State:
    init: Params  # the shared initial weights of every cluster model
    stage: str = ENCODER  # the stage the next round runs in
    models: list[Params] = field(default_factory=list)  # the K cluster models (encoder + head)
    assignment: dict[int, int] = field(default_factory=dict)  # client -> cluster, set by the first round
    head: Params | None = None  # the global classifier over the concatenated features (stage 3)
    inner: Any = None  # stage 2 by a clustered algorithm (hp.clustering: table10.py): its State


def init(fed: Federation, hp: Hparams) -> State:
    return State(get_params(fed.task.build_model()))


def models(state: State, hp: Hparams) -> list[SavedModel]:
    """The concatenated model (``global``) once stage 3 has a head, and the K cluster models (the
    encoders, with their own heads); mid-stage-2, the clustered algorithm's models."""
    members = members_of(state.assignment)
    if state.head is not None:
        whole = global_model(concat_params(state.models, state.head), Arch(len(state.models)))
        return [*whole, *cluster_models(state.models, members)]
    if state.inner is not None:
        return table10.models(state, hp)
    return cluster_models(state.models, members) if state.models else global_model(state.init)


def cluster_by_label_distributions(fed: Federation, hp: Hparams) -> Clustering:
    """Stage 1-A: every client sends its label distribution (noised for DP if asked); K-means."""
    if hp.num_clusters == 1 and not hp.elbow_range:
        return one_cluster(fed.client_ids, ENCODER)  # nothing to send: FedAvg's messages exactly
    return kmeans(reported_distributions(fed, hp.eps), hp, fed.task.rng("clustering"))


def kmeans(vectors: dict[int, np.ndarray], hp: Hparams, rng: np.random.Generator) -> Clustering:
    """K-means (balanced, or K by the elbow, as asked) on the clients' distribution vectors."""
    return cluster_vectors(vectors, hp.num_clusters, rng, hp.balanced, hp.elbow_range, stage=ENCODER)


def next_stage(hp: Hparams, rnd: int) -> str:  # the stage the round after ``rnd`` runs in
    return CLASSIFIER if rnd + 1 >= hp.encoder_rounds else ENCODER


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    if rnd >= hp.encoder_rounds:
        return classifier_round(state, fed, hp, rnd)
    if hp.clustering in table10.CLUSTERED_STAGES:
        return table10.clustered_stage(state, fed, hp, rnd, next_stage(hp, rnd))
    records: list[Record] = []
    if not state.assignment:
        clustering = cluster_by_label_distributions(fed, hp)
        models, records = start_clusters(state.init, clustering, stage=ENCODER)
        state = replace(state, models=models, assignment=clustering.assignment)
    models, train = clustered_fedavg_round(fed, state.models, state.assignment, rnd, ENCODER)
    return replace(state, models=models, stage=next_stage(hp, rnd)), records + train


def classifier_round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:
    """Stage 3 (`fedray.algorithms.concat.classifier`): a global classifier over the K frozen, concatenated encoders."""
    if state.head is None:  # the first classifier round: every client receives the encoders once
        head = concat.first_head(fed, state.models, hp.cache_features, hp.init_from_clusters)
        state = replace(state, head=head)
    head, records = concat.classifier_round(
        fed, len(state.models), state.head, rnd, hp.classifier_steps, CLASSIFIER
    )
    return replace(state, head=head, stage=CLASSIFIER), records


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    if rnd < hp.encoder_rounds and hp.clustering in table10.CLUSTERED_STAGES:
        return table10.evaluate(state, fed, hp, rnd)
    if rnd < hp.encoder_rounds:
        end = rnd + 1 == hp.encoder_rounds  # the end of stage 2: also each model on its members' data
        return cluster_model_records(fed, state.models, state.assignment, ENCODER, members=end)
    params, k = concat_params(state.models, state.head), len(state.models)
    train = (concat.train_split_eval, {"head": state.head, "k": k})  # the clients' kept features
    test = (concat.test_split_eval, {"head": state.head, "models": state.models})  # the workers' kept ones
    return single_model_records(fed, params, CLASSIFIER, Arch(k), train, test)
