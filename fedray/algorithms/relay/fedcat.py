"""FedCat: Hu, Liu, Ling, Yue, Chen, "FedCat: Towards Accurate Federated Learning via Device
Concatenation", arXiv 2202.12751, 2022 (docs/algorithms/fedcat.md#fedcat-and-clustered-sampling; there is no public code).

K model copies travel through K devices each over a cycle of K rounds. Per round r (offset
o = r mod K):

- every lambda cycles the N devices are split at random into K equal groups (docs/algorithms/fedcat.md#fedcat step a);
- DevSelect picks one device per group from the count table M (eqs. 4-5: weight 1/sqrt(M[d][o]),
  greedy with probability epsilon, else weighted sampling) and increments M[d][o];
- at a cycle start the K copies are m_glb, each with accumulated data size d_i = 0;
- copy i trains on the device of group (o + i) mod K (a Latin square: over a cycle each copy meets
  one selected device of every group) and d_i grows by that device's data size;
- at the cycle end m_glb = sum_i d_i m_i / sum_j d_j (eq. 3) and the model is evaluated.

Every round trains K devices, one model each: the traffic of FedAvg with K participants. The
copies go device to device (`Federation.relay`: under Ray, actor to actor) and reach the
coordinator only at aggregation. The assignments table records, per round, which device (client)
trained which copy (cluster); scope-client ``group`` rows record the groups when they are drawn.

Where the paper is silent (epsilon 0.1, lambda 5, the zero-count rule, random argmax ties, the
device's model replacing the copy, the optimizer's state on each hop, the partition), fedray's
decision and why: docs/algorithms/fedcat.md. Ablations (Table 3): ``grouping: false`` is FedCat w/ DC (K
devices uniformly at random, FedAvg's sampling, no groups or counts); ``concatenation: false`` is
FedCat w/ GC (K fresh copies of m_glb each round, aggregated at once). Both off is FedAvg exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.algorithms.evaluation import single_model_records
from fedray.algorithms.plan import RunPlan
from fedray.algorithms.relay.selection import latin_square, select_devices
from fedray.algorithms.rounds import kept_optimizer_update, local_sgd_reply, train_records
from fedray.algorithms.scale import check_fits
from fedray.config.hparams import bound, one_of
from fedray.engine.client import Client
from fedray.federation import Baton, Federation, participants
from fedray.params import Params, get_params, weighted_average
from fedray.records import Record, assignment_rec
from fedray.storage.export import SavedModel, global_model


@dataclass
class Hparams:
    # K: groups = devices per round = model copies = cycle length; 0 = floor(N * participation)
    num_groups: int = field(default=0, metadata=bound(ge=0))
    # probability of the greedy choice in DevSelect (Alg. 3); else eq. 5 sampling
    epsilon: float = field(default=0.1, metadata=bound(ge=0, le=1))
    # lambda: devices are regrouped every lambda cycles (lambda * K rounds)
    regroup_cycles: int = field(default=5, metadata=bound(ge=1))
    grouping: bool = True  # False: FedCat w/ DC, K devices uniformly at random (no groups, no counts)
    concatenation: bool = True  # False: FedCat w/ GC, aggregation every round (no hand-offs)
    # SGD state on each hop: fresh (a new optimizer per device) | carried (the momentum buffers travel
    # with the copy from device to device, reset at each cycle start; the paper is silent)
    optimizer_state: str = field(default="fresh", metadata=one_of("fresh", "carried"))


def num_groups(hp: Hparams, num_clients: int, participation: float) -> int:
    return hp.num_groups or participants(num_clients, participation)


def check_run(run: RunPlan, hp: Hparams) -> None:
    k_from_p = participants(run.num_clients, run.participation)
    k = num_groups(hp, run.num_clients, run.participation)
    if k > run.num_clients:
        raise ValueError(f"config key 'hp.num_groups': {k} groups but only {run.num_clients} clients")
    if hp.num_groups and hp.num_groups != k_from_p:
        raise ValueError(
            f"config key 'hp.num_groups': FedCat trains one device per group each round, so K = "
            f"{hp.num_groups} groups means K participants, but participation={run.participation} of "
            f"{run.num_clients} clients is {k_from_p}; set participation: {hp.num_groups / run.num_clients:g} "
            "or leave hp.num_groups at 0 (derived from participation)"
        )
    # counts: how often each client trained in each group, N x K int64, copied every round
    check_fits(
        run, lambda n: 16.0 * n * num_groups(hp, n, run.participation), "keeps an N x K table of counts"
    )
    if hp.optimizer_state == "carried" and not hp.concatenation:
        raise ValueError(
            "config key 'hp.optimizer_state': carried moves the momentum with a copy from device to device, "
            "but with hp.concatenation: false (FedCat w/ GC) every copy trains on one device only; "
            "leave it at fresh"
        )
    if hp.concatenation and run.rounds % k:
        up, down = (run.rounds // k + 1) * k, run.rounds // k * k
        raise ValueError(
            f"config key 'rounds': FedCat aggregates at the end of each cycle of K = {k} rounds; rounds={run.rounds} "
            f"would leave {run.rounds % k} rounds of training unaggregated. Set rounds: {up}"
            + (f" (or {down})" if down else "")
        )


@dataclass
class State:
    params: Params  # m_glb
    counts: np.ndarray  # M, N x K: how often client position d was chosen at cycle position o
    # G_1..G_K (client ids), redrawn every lambda cycles
    groups: list[list[int]] = field(default_factory=list)
    copies: list[Baton] = field(default_factory=list)  # the K copies in flight (none between cycles)
    sizes: list[int] = field(default_factory=list)  # d_i: data each copy has trained on this cycle


def models(state: State, hp: Hparams) -> list[SavedModel]:
    return global_model(state.params)


def init(fed: Federation, hp: Hparams) -> State:
    k = num_groups(hp, len(fed.client_ids), fed.task.participation)
    return State(get_params(fed.task.build_model()), np.zeros((len(fed.client_ids), k), dtype=np.int64))


def train_copy(client: Client, cstate: Any, msg: tuple[Any, dict]):
    """Relay client function: train the copy it is handed for the round's local epochs; the copy
    goes on (left behind), only the size and training stats come back. With ``carried`` optimizer
    state the copy is ``(params, momentum buffers)`` (plain params at a cycle start: no buffers).
    The K copies of a round train on K devices at once: one stack where a worker trains batched."""
    carry, common = msg
    if common.get("optimizer_state") == "carried":
        params, buffers = carry if isinstance(carry, tuple) else (carry, None)
        reply, buffers = yield from kept_optimizer_update(client, params, common["round"], buffers, keep=True)
        return ((reply.pop("params"), buffers), reply), cstate
    reply = yield from local_sgd_reply(client, carry, common["round"])
    return (reply.pop("params"), reply), cstate


def params_of(carry: Any) -> Params:
    """A copy's model, with or without the momentum it carries."""
    return carry[0] if isinstance(carry, tuple) else carry


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    k = state.counts.shape[1]
    counts = state.counts.copy()
    devices, groups, records = select_devices(counts, state.groups, fed, hp, rnd)
    offset = rnd % k
    if hp.concatenation:
        route = latin_square(devices, offset)  # copy i -> device of group (o + i) mod K
        carries: list[Any] = state.copies if offset else [state.params] * k
        sizes = state.sizes if offset else [0] * k
    else:  # w/ GC: K fresh copies of m_glb, in device order (as FedAvg's participants)
        route, carries, sizes = sorted(devices), [state.params] * k, [0] * k
    common = {"round": rnd, **({"optimizer_state": "carried"} if hp.optimizer_state == "carried" else {})}
    hops = fed.relay(train_copy, list(zip(route, carries, strict=True)), common)
    copies = [b for b, _ in hops]
    sizes = [d + info["num_examples"] for d, (_, info) in zip(sizes, hops, strict=True)]
    records += train_records({c: info for c, (_, info) in zip(route, hops, strict=True)})
    records += [assignment_rec(c, i) for i, c in enumerate(route)]
    params = state.params
    if not hp.concatenation or offset == k - 1:  # eq. 3, once per cycle
        params = weighted_average([params_of(c) for c in fed.fetch(copies)], sizes)
        copies, sizes = [], []
    return State(params, counts, groups, copies, sizes), records


def evaluate_after(state: State, hp: Hparams, rnd: int) -> bool:
    """Evaluate after every cycle (the paper: after each aggregation, every K rounds), whatever eval_every says."""
    return (rnd + 1) % state.counts.shape[1] == 0


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    """m_glb on the global test set, at cycle ends only: between aggregations m_glb is the last
    aggregated model, and a mid-cycle row (eval_every not a multiple of K) would show it as if it
    were the current one, so curves would be misread. (w/ GC aggregates every round.)"""
    if hp.concatenation and (rnd + 1) % state.counts.shape[1] != 0:
        return []
    return single_model_records(fed, state.params)
