"""Cluster-wise FedAvg: one FedAvg per group of clients, the groups fixed before training.

As stage 2 of FedConcat (Diao, Li, He, "Exploiting Label Skews in Federated Learning with Model
Concatenation", AAAI 2024; ALGORITHMS.md §1(a) steps 6-7), usable on its own:

- groups: ``oracle`` takes the partition's ground-truth groups (partitions that have them, e.g.
  ``dominant``); ``kmeans`` clusters the clients' label distributions (F1) with scikit-learn's
  K-means, as FedConcat's stage 1-A (each client sends its label distribution, as in FedConcat).
- every cluster model starts from the same random weights (register row 5);
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

import numpy as np

from fedray.client import Client
from fedray.clustering import Clustering, cluster_vectors, label_distributions, laplace_noise
from fedray.evaluation import cluster_model_records, lowest_loss_global
from fedray.export import SavedModel, cluster_models, global_model, members_of
from fedray.federation import Federation
from fedray.hparams import bound, one_of
from fedray.params import Params, get_params
from fedray.records import Record, assignment_rec, rec
from fedray.rounds import clustered_fedavg_round

GROUPS = ("kmeans", "oracle")


@dataclass
class Hparams:
    # K: number of client groups (oracle: must equal partition_clusters)
    num_clusters: int = field(default=5, metadata=bound(ge=1))
    # kmeans (on label distributions) | oracle (the partition's ground truth)
    groups: str = field(default="kmeans", metadata=one_of(*GROUPS))


def check_config(cfg, hp: Hparams) -> None:
    from fedray.data import GROUPED_PARTITIONS

    if hp.num_clusters > cfg.num_clients:
        raise ValueError(
            f"config key 'hp.num_clusters': {hp.num_clusters} clusters but only {cfg.num_clients} clients"
        )
    if hp.groups == "oracle":
        if cfg.partition not in GROUPED_PARTITIONS:
            raise ValueError(
                f"config key 'hp.groups': oracle needs a partition with ground-truth groups "
                f"({', '.join(sorted(GROUPED_PARTITIONS))}); partition is {cfg.partition!r} (use hp.groups: kmeans)"
            )
        if hp.num_clusters != cfg.partition_clusters:
            raise ValueError(
                f"config key 'hp.num_clusters': the oracle has partition_clusters={cfg.partition_clusters} groups; "
                f"set hp.num_clusters: {cfg.partition_clusters}"
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


def oracle_groups(fed: Federation, k: int, stage: str = "") -> Clustering:
    if fed.groups is None:
        raise ValueError("hp.groups=oracle: the partition has no ground-truth groups")
    sizes = [sum(1 for g in fed.groups.values() if g == j) for j in range(k)]
    records = [rec("num_clusters", k, stage=stage)]
    records += [rec("cluster_size", n, scope="cluster", entity=j, stage=stage) for j, n in enumerate(sizes)]
    return Clustering(dict(fed.groups), k, records)


def label_distribution_reply(client: Client, cstate: Any, msg: dict) -> tuple[dict, Any]:
    """Client function: its label distribution P_i (F1), with Laplace noise added on the client
    when ``eps`` > 0 (F3), so that the server only ever sees the noised vector."""
    p = label_distributions({client.cid: client.label_counts()})
    if msg["eps"] > 0:
        p = laplace_noise(p, msg["eps"], client.task.rng("dp_noise", client.cid))
    return {"distribution": p[0]}, cstate


def one_cluster(cids: list[int], stage: str = "") -> Clustering:
    """K = 1: every client in cluster 0, known without asking the clients anything."""
    records = [
        rec("num_clusters", 1, stage=stage),
        rec("cluster_size", len(cids), scope="cluster", entity=0, stage=stage),
    ]
    return Clustering({c: 0 for c in cids}, 1, records)


def reported_distributions(fed: Federation, eps: float = 0.0) -> dict[int, np.ndarray]:
    """Every client's label distribution as it sends it (noised on the client if ``eps`` > 0)."""
    replies = fed.map(label_distribution_reply, fed.client_ids, {"eps": eps})
    return {c: replies[c]["distribution"] for c in sorted(replies)}


def group_clients(fed: Federation, hp: Hparams, stage: str = "") -> Clustering:
    if hp.groups == "oracle":
        return oracle_groups(fed, hp.num_clusters, stage)
    if hp.num_clusters == 1:
        return one_cluster(fed.client_ids, stage)
    vectors = reported_distributions(fed)
    return cluster_vectors(vectors, hp.num_clusters, fed.task.rng("clustering"), stage=stage)


def start_clusters(
    state_init: Params, clustering: Clustering, stage: str = ""
) -> tuple[list[Params], list[Record]]:
    """K identical copies of the shared init, and the records of the clustering with its assignment."""
    models = [dict(state_init) for _ in range(clustering.k)]  # arrays are never changed in place
    records = clustering.records + [
        assignment_rec(c, k, stage=stage) for c, k in sorted(clustering.assignment.items())
    ]
    return models, records


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
