"""FedConcat-ID: FedConcat without label distributions (Diao, Li, He, AAAI 2024, Sec. 3.2;
docs/algorithms/fedconcat.md#stage-1-b-clusters-from-inferred-distributions steps 4'-5'; reference code sjtudyq/FedConcat experiments-fedconcat-id.py).

The server never sees label counts. Instead, in the first round every client (all of them,
whatever ``participation`` says) trains the shared initial model for its local epochs and reports
its model's mean softmax over ``random_inputs`` inputs drawn uniformly over the data's range
(eq. F2: 100 batches of 100 by default). K-means clusters those inferred distributions, and that
round also seeds the cluster models: each is the data-size-weighted average of its members'
round-0 models (docs/algorithms/fedconcat.md#d6-fedconcat-ids-inference-round-is-encoder-round-0), so the round counts as encoder round 0. Stages 2 and 3 are
FedConcat's.

Deviation: the random inputs go through the model in eval mode (the code leaves train mode on;
the same for models without dropout or batch norm, such as the simple CNN).

Diagnostics that do not feed the algorithm: the L1 distance between each client's inferred and
true label distribution, recorded as ``inference_l1`` (scope client, and the mean over clients).
The simulator computes it from the partition, as it computes test accuracy: it is not part of any
client's reply, so the server learns nothing of the labels and no byte is counted for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from fedray.algorithms.clustering import label_distributions
from fedray.algorithms.concat import fedconcat
from fedray.algorithms.concat.fedconcat import (  # noqa: F401 - the record
    ENCODER,
    State,
    check_run,
    evaluate,
    init,
    models,
    rounds_from_hp,
)
from fedray.algorithms.rounds import fedavg_aggregate, local_sgd_reply, train_records
from fedray.config import seeding
from fedray.config.hparams import bound
from fedray.engine.client import Client
from fedray.federation import Federation
from fedray.records import Record, assignment_rec, rec

BATCH = 100  # random inputs per forward pass (the code's 100 x 100)


@dataclass
class Hparams(fedconcat.Hparams):
    # r: random inputs per client for the inferred distribution (eq. F2)
    random_inputs: int = field(default=10_000, metadata=bound(ge=1))

    def check(self) -> None:
        super().check()
        if self.eps > 0:
            raise ValueError(
                "config key 'hp.eps': FedConcat-ID sends no label distributions to protect; use algorithm fedconcat for DP"
            )
        if self.clustering != "kmeans":
            raise ValueError(
                f"config key 'hp.clustering': FedConcat-ID clusters the inferred distributions by K-means "
                f"(its stage 1), got {self.clustering!r}; use algorithm fedconcat for clustered stage-2 variants"
            )


@torch.no_grad()
def inferred_distribution(client: Client, model: torch.nn.Module, n: int) -> np.ndarray:
    """Eq. F2: the mean softmax of ``model`` over ``n`` random inputs, drawn from (seed, client)."""
    gen = seeding.torch_generator(client.task.seed, "random_inputs", client.cid)
    model.eval()
    total = torch.zeros(client.task.spec.num_classes, dtype=torch.float64, device=client.device)
    for start in range(0, n, BATCH):
        x = client.task.layout(client.task.spec.random_inputs(min(BATCH, n - start), gen)).to(client.device)
        total += torch.softmax(model(x), dim=1).sum(dim=0).double()
    return (total / n).cpu().numpy()  # float64 sums are the same on either device; one copy back


def train_and_infer(client: Client, cstate: Any, msg: dict):
    """Client function, round 0: train the shared init, then report the inferred label distribution."""
    reply = yield from local_sgd_reply(client, msg["params"], msg["round"])
    reply["inferred"] = inferred_distribution(client, client.model(reply["params"]), msg["random_inputs"])
    return reply, cstate


def inference_round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:
    """Stage 1-B, which is also encoder round 0."""
    msg = {"params": state.init, "round": rnd, "random_inputs": hp.random_inputs}
    replies = fed.map(train_and_infer, fed.client_ids, msg)  # every client, whatever participation says
    vectors = {c: r["inferred"] for c, r in replies.items()}
    clustering = fedconcat.kmeans(vectors, hp, fed.task.rng("clustering"))
    cluster_params = []
    for k in range(clustering.k):
        members = {c: r for c, r in replies.items() if clustering.assignment[c] == k}
        # an empty cluster keeps the init
        cluster_params.append(fedavg_aggregate(members) if members else dict(state.init))
    records = train_records(replies, ENCODER) + clustering.records
    records += [assignment_rec(c, k, stage=ENCODER) for c, k in sorted(clustering.assignment.items())]
    counts = fed.label_counts()  # the simulator's knowledge, for the diagnostic only
    truth = dict(zip(sorted(counts), label_distributions(counts), strict=True))
    l1 = {c: float(np.abs(vectors[c] - truth[c]).sum()) for c in sorted(vectors)}
    records += [rec("inference_l1", d, scope="client", entity=c, stage=ENCODER) for c, d in l1.items()]
    records.append(rec("inference_l1", float(np.mean(list(l1.values()))), stage=ENCODER))
    for k in range(clustering.k):
        n = sum(1 for c in replies if clustering.assignment[c] == k)
        records.append(rec("participants", n, scope="cluster", entity=k, stage=ENCODER))
    state = replace(
        state, models=cluster_params, assignment=clustering.assignment, stage=fedconcat.next_stage(hp, rnd)
    )
    return state, records


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    if rnd == 0:
        return inference_round(state, fed, hp, rnd)
    return fedconcat.round(state, fed, hp, rnd)
