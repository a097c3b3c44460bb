"""Clustered sampling (CluSamp): Fraboni, Vidal, Kameni, Lorenzi, "Clustered Sampling: Low-Variance
and Improved Representativity for Clients Selection in Federated Learning", ICML 2021; the FedCat
paper's sampling baseline (docs/algorithms/fedcat.md#clustered-sampling-clusamp).

FedAvg with a different draw of the round's clients. The server builds m distributions ("strata")
r_1..r_m over the clients with sum_k r_{k,i} = m p_i (p_i = n_i / n) and draws one client from each;
the new model is the plain mean of the m drawn clients' models (weight 1/m per draw), which is
unbiased for sum_i p_i theta_i. A client drawn by two strata trains once and counts twice (it would
train to the same model: its batches are drawn from (seed, client, round)).

- ``similarity: none``: Algorithm 1, strata from the sample sizes alone (fixed for the run).
- ``similarity: arccos | L2 | L1``: Algorithm 2, every round: each client's representative
  gradient is its last update (its trained model minus the model it received; zero before its first
  draw); a Ward tree over the clients' distance matrix is cut into clusters of mass at most 1/m,
  which fill the strata (`fedray.algorithms.sampling.strata.similarity_strata`, as the reference code).

The server sees the clients' sample sizes (as in the paper) and, for Algorithm 2, keeps every
client's last update: N models of memory in State.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from fedray.algorithms.evaluation import single_model_records
from fedray.algorithms.plan import RunPlan
from fedray.algorithms.rounds import local_update, train_records
from fedray.algorithms.sampling.strata import (
    draw_from_strata,
    sample_size_strata,
    similarity_strata,
    update_distances,
)
from fedray.algorithms.scale import check_fits
from fedray.config.hparams import bound, one_of
from fedray.federation import Federation, participants
from fedray.params import Params, get_params, weighted_average
from fedray.records import Record, assignment_rec, rec
from fedray.storage.export import SavedModel, global_model

SIMILARITIES = ("arccos", "L2", "L1", "none")


@dataclass
class Hparams:
    # m: strata = clients drawn per round; 0 = floor(N * participation)
    num_strata: int = field(default=0, metadata=bound(ge=0))
    # Algorithm 2's distance between last updates (arccos | L2 | L1); none = Algorithm 1
    similarity: str = field(default="arccos", metadata=one_of(*SIMILARITIES))


@dataclass
class State:
    params: Params  # the global model
    # client -> its last update, flattened (Alg. 2)
    updates: dict[int, np.ndarray] = field(default_factory=dict)


def check_run(run: RunPlan, hp: Hparams) -> None:
    """Algorithm 2 keeps every drawn client's last update and builds the N x N distances each round:
    a cross-silo cost, refused beyond half this machine's memory (Algorithm 1's strata are m x N)."""
    if hp.similarity == "none":
        return check_fits(
            run,
            lambda n: 8.0 * n * (hp.num_strata or participants(n, run.participation)),
            "builds m x N strata each round",
        )
    dims = run.trainable_values()
    check_fits(
        run,
        lambda n: 8.0 * n * dims + 8.0 * n * n,
        f"keeps every drawn client's last update ({dims:,} values) and builds the N x N distances each round",
    )


def models(state: State, hp: Hparams) -> list[SavedModel]:
    return global_model(state.params)


def init(fed: Federation, hp: Hparams) -> State:
    return State(get_params(fed.task.build_model()))


def float_keys(params: Params) -> list[str]:
    """The entries a representative gradient covers: the floating-point ones, in sorted order."""
    return [k for k in sorted(params) if np.issubdtype(np.asarray(params[k]).dtype, np.floating)]


def flat_update(trained: Params, sent: Params) -> np.ndarray:
    """The representative gradient: trained - sent over the floating-point entries, one vector."""
    keys = float_keys(sent)
    return np.concatenate([(np.asarray(trained[k]) - np.asarray(sent[k])).ravel() for k in keys]).astype(
        np.float32
    )


def strata(state: State, fed: Federation, hp: Hparams, rnd: int) -> np.ndarray:
    ids = fed.client_ids
    n = fed.num_examples()
    sizes = [n[c] for c in ids]
    m = hp.num_strata or participants(len(ids), fed.task.participation)
    if hp.similarity == "none":
        return sample_size_strata(sizes, m)
    dim = sum(np.asarray(state.params[k]).size for k in float_keys(state.params))
    g = np.zeros((len(ids), dim), dtype=np.float32)
    for p, c in enumerate(ids):
        if c in state.updates:
            g[p] = state.updates[c]
    return similarity_strata(
        update_distances(g, hp.similarity), sizes, m, fed.task.rng("clusamp/strata", rnd=rnd)
    )


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    ids = fed.client_ids
    draws = [
        ids[p] for p in draw_from_strata(strata(state, fed, hp, rnd), fed.task.rng("clusamp/draw", rnd=rnd))
    ]
    times = Counter(draws)
    clients = sorted(times)
    replies = fed.map(local_update, clients, {"params": state.params, "round": rnd})
    params = weighted_average([replies[c]["params"] for c in clients], [times[c] for c in clients])
    updates = state.updates
    if hp.similarity != "none":
        updates = {**updates, **{c: flat_update(replies[c]["params"], state.params) for c in clients}}
    records = train_records(replies)
    records += [rec("draws", len(draws)), *(assignment_rec(c, k) for k, c in enumerate(draws))]
    return State(params, updates), records


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    return single_model_records(fed, state.params)
