"""One model per cluster of clients, the clusters known before training: the pieces clustered
FedAvg (`fedray.algorithms.clustered.clusterfedavg`) and FedConcat's stage 1 share. The clusters come from the
partition's ground truth (``oracle``), from nothing (K = 1), or from the label distributions the
clients report (F1, noised on the client for DP, F3); `start_clusters` gives each cluster a copy of
the shared initial weights and the records of the choice.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedray.algorithms.clustering import Clustering, label_distributions, laplace_noise
from fedray.engine.client import Client
from fedray.federation import Federation
from fedray.params import Params
from fedray.records import Record, assignment_rec, rec


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


def start_clusters(
    state_init: Params, clustering: Clustering, stage: str = ""
) -> tuple[list[Params], list[Record]]:
    """K identical copies of the shared init, and the records of the clustering with its assignment."""
    models = [dict(state_init) for _ in range(clustering.k)]  # arrays are never changed in place
    records = clustering.records + [
        assignment_rec(c, k, stage=stage) for c, k in sorted(clustering.assignment.items())
    ]
    return models, records
