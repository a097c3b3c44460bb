"""Cluster-wise FedAvg: one FedAvg per group of clients, the groups fixed before training.

As stage 2 of FedConcat (Diao, Li, He, "Exploiting Label Skews in Federated Learning with Model
Concatenation", AAAI 2024; docs/algorithms/fedconcat.md#stage-2-cluster-wise-fedavg steps 6-7), usable on its own:

- groups: ``oracle`` takes the partition's ground-truth groups (partitions that have them, e.g.
  ``dominant``); ``kmeans`` clusters the clients' label distributions (F1) with scikit-learn's
  K-means, as FedConcat's stage 1-A (each client sends its label distribution, as in FedConcat).
- every cluster model starts from the same random weights (docs/algorithms/fedconcat.md#d5-one-initialisation-for-every-cluster);
- each round, FedAvg's participants train their own cluster's model, all clusters at once; a
  cluster without participants keeps its model.

There is no global model: evaluation gives each cluster model's ``accuracy`` on the global test
set (scope cluster) and, with ``client_test_fraction`` > 0, each client's ``local_accuracy`` with its
cluster's model (per client, per cluster and overall). The assignment is written to
``assignments/`` with the first round.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fedray.algorithms.clustered.groups import (
    one_cluster,
    oracle_groups,
    reported_distributions,
    start_clusters,
)
from fedray.algorithms.clustering import Clustering, cluster_vectors
from fedray.algorithms.evaluation import cluster_model_records, lowest_loss_global
from fedray.algorithms.plan import RunPlan
from fedray.algorithms.rounds import clustered_fedavg_round
from fedray.config.hparams import bound, one_of
from fedray.federation import Federation
from fedray.params import Params, get_params
from fedray.records import Record
from fedray.storage.export import SavedModel, cluster_models, global_model, members_of

GROUPS = ("kmeans", "oracle")


@dataclass
class Hparams:
    # K: number of client groups (oracle: must equal partition_clusters)
    num_clusters: int = field(default=5, metadata=bound(ge=1))
    # kmeans (on label distributions) | oracle (the partition's ground truth)
    groups: str = field(default="kmeans", metadata=one_of(*GROUPS))


def check_run(run: RunPlan, hp: Hparams) -> None:
    from fedray.data import GROUPED_PARTITIONS

    if hp.num_clusters > run.num_clients:
        raise ValueError(
            f"config key 'hp.num_clusters': {hp.num_clusters} clusters but only {run.num_clients} clients"
        )
    if hp.groups == "oracle":
        if run.partition not in GROUPED_PARTITIONS:
            raise ValueError(
                f"config key 'hp.groups': oracle needs a partition with ground-truth groups "
                f"({', '.join(sorted(GROUPED_PARTITIONS))}); partition is {run.partition!r} (use hp.groups: kmeans)"
            )
        if hp.num_clusters != run.partition_clusters:
            raise ValueError(
                f"config key 'hp.num_clusters': the oracle has partition_clusters={run.partition_clusters} groups; "
                f"set hp.num_clusters: {run.partition_clusters}"
            )


@dataclass
class State:
    init: Params  # the shared initial weights of every cluster model
    models: list[Params] = field(default_factory=list)  # one per cluster, once the clients are grouped
    assignment: dict[int, int] = field(default_factory=dict)  # client -> cluster


def init(fed: Federation, hp: Hparams) -> State:
    return State(get_params(fed.task.build_model()))


def models(state: State, hp: Any) -> list[SavedModel]:
    """Each cluster's model (with its member clients); before any grouping, the initial model."""
    if not state.models:
        return global_model(state.init)
    return cluster_models(state.models, members_of(state.assignment))


def group_clients(fed: Federation, hp: Hparams, stage: str = "") -> Clustering:
    if hp.groups == "oracle":
        return oracle_groups(fed, hp.num_clusters, stage)
    if hp.num_clusters == 1:
        return one_cluster(fed.client_ids, stage)
    vectors = reported_distributions(fed)
    return cluster_vectors(vectors, hp.num_clusters, fed.task.rng("clustering"), stage=stage)


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    records: list[Record] = []
    models, assignment = state.models, state.assignment
    if not assignment:
        clustering = group_clients(fed, hp)
        models, records = start_clusters(state.init, clustering)
        assignment = clustering.assignment
    models, train = clustered_fedavg_round(fed, models, assignment, rnd)
    return State(state.init, models, assignment), records + train


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    # Global accuracy: the cluster model with the lowest loss on the global test set (the rule of
    # the other clustered algorithms, `lowest_loss_global`).
    return lowest_loss_global(cluster_model_records(fed, state.models, state.assignment))
