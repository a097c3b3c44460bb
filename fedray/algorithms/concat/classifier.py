"""A global classifier over K frozen, concatenated encoders: FedConcat's stage 3 (docs/algorithms/fedconcat.md#stage-3-a-global-classifier-over-concatenated-encoders),
which FedConcat-ID runs too.

The first classifier round sends the K cluster models to every client once (eq. F6's "+K"); a client
keeps the features of its training split (computed once, no augmentation, eval mode: the paper,
Sec. 3.3) or, with ``cache: false``, the encoders themselves to run on every augmented batch in
train mode (the reference code, docs/algorithms/fedconcat.md#d1-classifier-features-computed-once-or-at-every-step). Per round each participant takes ``steps``
mini-batch steps of fresh SGD on the classifier alone, and the server averages the classifiers
without weights (every participant took the same number of steps, docs/algorithms/fedconcat.md#d2-three-classifier-steps-averaged-without-weights).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from fedray.algorithms.evaluation import stats_reply
from fedray.algorithms.rounds import train_records, train_reply
from fedray.engine.client import Client
from fedray.engine.evaluation import eval_feature_batches, evaluate, evaluate_batches
from fedray.engine.stats import EvalStats
from fedray.engine.update import LocalUpdate
from fedray.federation import Federation
from fedray.models import Arch, concat_params, head_from_clusters
from fedray.params import Params, get_params, params_digest, weighted_average
from fedray.records import Record


def receive_encoders(client: Client, cstate: Any, msg: dict) -> tuple[None, Any]:
    """Client function, once: the K cluster models arrive. Keep the features of the training split
    (computed once, no augmentation, eval mode), or the models themselves to recompute them."""
    models = msg["models"]
    if not msg["cache"]:
        return None, {"models": models}
    return None, {"features": encoded(client, models, client.eval_train_batches())}


def encoded(
    client: Client, models: list[Params], batches: Iterable[tuple[torch.Tensor, torch.Tensor]]
) -> np.ndarray:
    """The K encoders side by side on ``batches``' images, in eval mode: the features, in order."""
    net = client.model(
        concat_params(models, head_from_clusters(models)), slot="features", arch=Arch(len(models))
    )
    net.eval()
    with torch.no_grad():
        return torch.cat([net.encoder(x) for x, _ in batches]).cpu().numpy()  # one copy from a GPU


def classifier_update(client: Client, cstate: dict, msg: dict):
    """Client function: ``steps`` mini-batch steps of fresh SGD on the global classifier only."""
    k, rnd = msg["k"], msg["round"]
    if "features" in cstate:  # the classifier alone, on the kept features
        trained = yield LocalUpdate(
            msg["head"],
            rnd,
            arch=Arch(k, head_only=True),
            epochs=1,
            max_steps=msg["steps"],
            inputs=cstate["features"],
        )
        head = trained.params
    else:  # the reference code: frozen encoders run on every (augmented) batch, in train mode
        params = concat_params(cstate["models"], msg["head"])
        trained = yield LocalUpdate(
            params,
            rnd,
            arch=Arch(k),
            trainable=[f"head.{n}" for n in msg["head"]],
            epochs=1,
            max_steps=msg["steps"],
        )
        head = {n: trained.params[f"head.{n}"] for n in msg["head"]}
    return train_reply(client, head, trained.stats), cstate


def train_split_eval(client: Client, cstate: dict, msg: dict) -> tuple[dict, dict]:
    """Client function (stage 3's ``train_accuracy``): the K encoders the client holds under the
    classifier ``msg["head"]``, on its training split in `Client.eval_train_batches`' batches. With
    kept features the classifier runs on them alone: the encoders are frozen in stage 3 and the
    features came from those very batches in eval mode, so the numbers are the whole model's, bit
    for bit, without passing the images through K encoders every round (it was most of a round)."""
    k = msg["k"]
    if "features" in cstate:
        net = client.model(msg["head"], slot="head", arch=Arch(k, head_only=True))
        stats = evaluate(net, eval_feature_batches(client, cstate["features"], client.train_labels()))
    else:
        net = client.model(concat_params(cstate["models"], msg["head"]), slot="concat", arch=Arch(k))
        stats = evaluate(net, client.eval_train_batches())
    return stats_reply(stats), cstate


def test_split_eval(client: Client, cstate: Any, msg: dict) -> tuple[list[EvalStats], Any]:
    """Client function for `Federation.test_map` (stage 3's global ``accuracy``): per-batch stats of
    the classifier ``msg["head"]`` over the K encoders ``msg["models"]`` on the shard's test
    batches. The host keeps the shard's features for these encoders (they are frozen in stage 3), so
    each round runs the classifier alone: the same numbers as the whole model, bit for bit, as in
    `train_split_eval`."""
    models = msg["models"]
    version = (
        params_digest(models),
        client.num_test_examples,
        int(client.test_idx[0]) if client.num_test_examples else 0,
    )
    feats = client.kept(
        "concat-test-features", version, lambda: encoded(client, models, client.test_batches())
    )
    net = client.model(msg["head"], slot="head", arch=Arch(len(models), head_only=True))
    return evaluate_batches(net, eval_feature_batches(client, feats, client.test_labels())), cstate


def first_head(fed: Federation, encoders: list[Params], cache: bool, from_clusters: bool) -> Params:
    """The first classifier round's start: every client receives the encoders; the classifier is the
    cluster heads side by side (F5, ``from_clusters``) or a fresh random Linear."""
    fed.map(receive_encoders, fed.client_ids, {"models": encoders, "cache": cache})
    if from_clusters:
        return head_from_clusters(encoders)
    return get_params(fed.task.build_model("classifier_init", Arch(len(encoders), head_only=True)))


def classifier_round(
    fed: Federation, k: int, head: Params, rnd: int, steps: int, stage: str
) -> tuple[Params, list[Record]]:
    """One round of the classifier over the K encoders the clients hold: the new head and the records."""
    cids = fed.sample(fed.task.participation, fed.task.rng("sample", rnd=rnd))
    replies = fed.map(classifier_update, cids, {"head": head, "round": rnd, "k": k, "steps": steps})
    new = weighted_average([replies[c]["params"] for c in sorted(replies)], [1.0] * len(replies))
    return new, train_records(replies, stage)
