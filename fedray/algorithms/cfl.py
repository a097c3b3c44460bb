"""CFL: Sattler, Müller, Samek, "Clustered Federated Learning: Model-Agnostic Distributed Multitask
Optimization Under Privacy Constraints", IEEE TNNLS 2020 (ALGORITHMS.md §4.4, §6.1; register row 17).

One cluster of every client to start with; clusters split recursively. Each round every client
trains its cluster's model (with its own optimizer state kept across rounds, as the reference) and
the server forms the updates Delta_i = theta_i - theta_c. For each cluster c with more than two
members, when its mean update is small, ||mean_i Delta_i|| < ``eps1`` (near a stationary point of
the joint objective), while some member's is large, max_i ||Delta_i|| > ``eps2`` (the members do not
share one), c is bipartitioned by agglomerative clustering with complete linkage (scikit-learn) on
the cosine distances 1 - cos(Delta_i, Delta_j). Each cluster's model is then the n_i-weighted
average of its members' (the FedRC code's rule; a cluster that never splits is FedAvg).

Deviations and options, said openly:
- ``max_norm: coordinate`` is the FedRC code's rule (the largest absolute coordinate of any member's
  update, register row 17) instead of the largest update norm;
- ``eps_rule: relative`` reads ``eps1`` and ``eps2`` as fractions of the largest mean update norm
  any cluster has had so far in the run (LayerCFL §6.2(a)4, after CFL: eps1 about a tenth of
  it, eps2 in [eps1, 10 eps1]), so one setting serves any model and data scale; each round then
  records the ``eps1`` and ``eps2`` it used. ``absolute`` (the default) takes them as norms;
- ``warmup_rounds``: no split before that many rounds (Sattler's notebook: 20; the FedRC code: 0);
- ``max_clusters``: no split once there are that many clusters (the FedRC tables' "CFL (3)": 3;
  0 = no cap, the code's 100 in practice);
- every client takes part every round (the reference asserts it): the config must say
  ``participation: 1.0``;
- not built from Sattler's reference: the client lr decay (x 0.99 per call, §6.1(a)2) and the
  cached pre-split models a client may pick after training (§6.1(a)6);
- updates are of the trainable parameters only (buffers such as BatchNorm statistics are averaged
  but never compared), as the reference's named parameters.

The recursion is `fedray.splitting`'s, which `layercfl.py` runs with the similarity taken from
selected layers. With ground-truth
groups (``dominant``, ``rotation``) every round records ``purity`` and the gap of LayerCFL eqs. 21-22
(``gap``, ``gap_l2`` on the selected layers' updates; ``gap/LAYER`` and ``gap_l2/LAYER`` for every
layer: `analysis.layer_gaps` makes them a table; signed, where LayerCFL's plots show 0 for any
negative gap; after a split the clients' updates start from different cluster models, so the layer
study reads a run that does not split), and ``similarity_dims``, the size of what the
similarity is computed on.
"""

from __future__ import annotations

from typing import Any

from fedray.federation import Federation
from fedray.records import Record
from fedray.splitting import (  # noqa: F401 - the algorithm's evaluation and saved models
    Similarity,
    SplitHparams,
    SplitState,
    check_participation,
    evaluate,
    init_state,
    models,
    split_round,
)

__all__ = ["Hparams", "State", "check_config", "init", "round", "evaluate", "models"]

Hparams = SplitHparams  # eps1, eps2, eps_rule, max_norm, warmup_rounds, max_clusters, persistent_optimizer, drop_last
State = SplitState  # the clusters, their models, the layers, the split history


def check_config(cfg: Any, hp: Hparams) -> None:
    check_participation(cfg)


def init(fed: Federation, hp: Hparams) -> State:
    return init_state(fed, "all")


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    return split_round(state, fed, hp, rnd, Similarity())
