"""Evaluation of models: the global test set spread over the workers, local test splits on the clients,
and every algorithm's ``train_accuracy``.

``train_accuracy`` (and ``train_loss``) means one thing for every algorithm, the FedRC code's train
accuracy: after the round, each training client's predictor (the global model; its cluster's
model; its personal model; its mixture ensemble) on the client's own training split, without
augmentation, pooled over the clients' samples. ``fedray report --at best-train`` picks a run's round
by it. The running loss and accuracy of the round's local SGD steps are ``sgd_loss`` and
``sgd_accuracy``."""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from fedray.engine.client import Client
from fedray.engine.evaluation import evaluate_batches
from fedray.engine.stats import EvalStats, total
from fedray.engine.update import Evaluation
from fedray.federation import ClientFn, Federation
from fedray.models import TASK, Arch
from fedray.params import Params
from fedray.records import Record, rec


def model_msg(params: Params, arch: Arch = TASK) -> dict:
    """A message carrying a model: its parameters, and its arch when it is not the task's model."""
    return {"params": params} if arch == TASK else {"params": params, "arch": arch}


def received_model(client: Client, msg: dict) -> torch.nn.Module:
    return client.model(msg["params"], arch=msg.get("arch", TASK))


def eval_batches(client: Client, cstate: Any, msg: dict) -> tuple[list[EvalStats], Any]:
    """Client function: per-batch stats of the model ``msg["params"]`` on the client's test split."""
    return evaluate_batches(received_model(client, msg), client.test_batches()), cstate


def evaluate_global(
    fed: Federation, params: Params, arch: Arch = TASK, test: tuple[ClientFn, dict] | None = None
) -> EvalStats:
    """The model ``params`` on the full global test set, spread over the workers (their devices); or
    ``test``, a client function and its message giving that model's per-batch stats from what the
    workers keep (FedConcat's test features)."""
    fn, msg = test or (eval_batches, model_msg(params, arch))
    return total(fed.test_map(fn, msg))


def model_global_records(fed: Federation, params: Params, k: int, stage: str = "") -> list[Record]:
    """Cluster model k on the global test set: ``accuracy`` and ``loss`` rows of scope cluster."""
    g = evaluate_global(fed, params)
    return [
        rec("accuracy", g.accuracy, scope="cluster", entity=k, stage=stage),
        rec("loss", g.loss, scope="cluster", entity=k, stage=stage),
    ]


def received_evaluation(msg: dict, split: str) -> Evaluation:
    """The evaluation of the model a message carries (`model_msg`) on the client's ``split``."""
    return Evaluation(msg["params"], split, msg.get("arch", TASK))


def stats_reply(stats: EvalStats, **more: Any) -> dict:
    """An evaluation's reply: ``correct``, ``samples``, ``loss_sum`` (and ``more``)."""
    return {"correct": stats.correct, "samples": stats.samples, "loss_sum": stats.loss_sum, **more}


def local_eval(client: Client, cstate: Any, msg: dict) -> Generator[Evaluation, EvalStats, tuple[dict, Any]]:
    """Client function: the received model on the client's own test split. State unchanged."""
    stats = yield received_evaluation(msg, "test")
    return stats_reply(stats), cstate


def test_client_records(replies: Mapping[int, Mapping[str, Any]], stage: str = "") -> list[Record]:
    """FedRC's global accuracy: each test client's accuracy on its held-out part (scope client) and
    their mean (``accuracy``, ``loss``), from replies of ``correct``, ``samples``, ``loss_sum``."""
    records = [
        rec("accuracy", r["correct"] / r["samples"], scope="client", entity=c, stage=stage)
        for c, r in replies.items()
    ]
    acc = sum(r["correct"] / r["samples"] for r in replies.values()) / len(replies)
    loss = sum(r["loss_sum"] / r["samples"] for r in replies.values()) / len(replies)
    return [*records, rec("accuracy", acc, stage=stage), rec("loss", loss, stage=stage)]


def lowest_loss_eval(
    client: Client, cstate: Any, msg: dict
) -> Generator[Evaluation | list[Evaluation], Any, tuple[dict, Any]]:
    """Client function for hard clustering: the client's model of ``msg["models"]`` (its assignment in
    ``msg["assigned"]``, if it has one; else, as a test client of a hard-clustering method in
    docs/algorithms/clustered.md#common-setting-and-evaluation, the one with the lowest mean loss on its labelled part, first on ties),
    evaluated on its held-out part. State unchanged."""
    best = msg.get("assigned", {}).get(client.cid)
    if best is None:
        losses = yield [Evaluation(m) for m in msg["models"]]
        best = int(np.argmin([s.loss for s in losses]))
    stats = yield Evaluation(msg["models"][best], "train" if msg.get("on") == "train" else "test")
    return stats_reply(stats, model=best), cstate


def train_split_records(
    fed: Federation, groups: Sequence[tuple[Sequence[int], dict]], fn: ClientFn | None = None, stage: str = ""
) -> list[Record]:
    """``train_accuracy`` and ``train_loss``: each group's clients evaluate the group's message with
    ``fn`` (default: the received model on the client's training split), pooled over the samples;
    none with ``eval_train: false``."""
    if not fed.task.eval_train:
        return []
    replies = fed.map_groups(fn or member_eval, [g for g in groups if g[0]])
    samples = sum(r["samples"] for r in replies.values())
    if not samples:
        return []
    return [
        rec("train_accuracy", sum(r["correct"] for r in replies.values()) / samples, stage=stage),
        rec("train_loss", sum(r["loss_sum"] for r in replies.values()) / samples, stage=stage),
    ]


def cluster_global_records(fed: Federation, models: Sequence[Params], stage: str = "") -> list[Record]:
    """K models' global accuracy: with the shift preset's test clients, theirs with their lowest-loss
    model (`lowest_loss_records`); otherwise each model on the global test set (scope cluster) and
    the lowest-loss one's as the global ``accuracy`` (`lowest_loss_global`)."""
    if fed.test_client_ids:
        return lowest_loss_records(fed, models, stage)
    return lowest_loss_global(
        [r for k, m in enumerate(models) for r in model_global_records(fed, m, k, stage)], stage
    )


def lowest_loss_global(records: list[Record], stage: str = "") -> list[Record]:
    """``records`` plus the global ``accuracy`` and ``loss`` of a clustered algorithm on the global test
    set: those of the cluster model with the lowest loss on it (first on ties), and which model that
    is (``global_model``). The global test set is treated as one test client under FedRC's rule for
    hard-clustering methods (docs/algorithms/clustered.md#common-setting-and-evaluation: a test client takes the model with the lowest loss on
    its labelled data): a choice made on the test set, as that rule makes it."""
    per = {}
    for r in records:
        if r["scope"] == "cluster" and r["metric"] in ("accuracy", "loss"):
            per.setdefault(r["entity"], {})[r["metric"]] = r["value"]
    if not per:
        return records
    best = min(sorted(per), key=lambda k: per[k]["loss"])
    return [
        *records,
        rec("accuracy", per[best]["accuracy"], stage=stage),
        rec("loss", per[best]["loss"], stage=stage),
        rec("global_model", best, stage=stage),
    ]


def hard_cluster_records(
    fed: Federation, models: Sequence[Params], assigned: Mapping[int, int], stage: str = ""
) -> list[Record]:
    """K models and a hard assignment (IFCA, FeSEM): each model on the global test set (``accuracy``,
    ``loss``, scope cluster), or with test clients their accuracy with their lowest-loss model;
    ``local_accuracy`` of each client with a test split, with its assigned model (the lowest-loss one
    if it has none yet)."""
    records = cluster_global_records(fed, models, stage)
    with_test = [c for c, n in fed.num_test_examples(fed.eval_client_ids).items() if n > 0]
    if with_test:
        msg = {"models": list(models), "assigned": {c: assigned[c] for c in with_test if c in assigned}}
        records += own_data_records(fed, [(with_test, msg)], lowest_loss_eval, "local_accuracy", stage)
    msg = {
        "models": list(models),
        "assigned": {c: assigned[c] for c in fed.eval_client_ids if c in assigned},
        "on": "train",
    }
    return records + train_split_records(fed, [(fed.eval_client_ids, msg)], lowest_loss_eval, stage)


def lowest_loss_records(fed: Federation, models: Sequence[Params], stage: str = "") -> list[Record]:
    """FedRC's global accuracy for hard-clustering methods: each test client takes the model with the
    lowest loss on its labelled part; `test_client_records` of that, plus the model each took
    (``test_client_model``, scope client)."""
    replies = fed.map(lowest_loss_eval, fed.test_client_ids, {"models": list(models)})
    return [
        *test_client_records(replies, stage),
        *(
            rec("test_client_model", r["model"], scope="client", entity=c, stage=stage)
            for c, r in replies.items()
        ),
    ]


def single_model_records(
    fed: Federation,
    params: Params,
    stage: str = "",
    arch: Arch = TASK,
    train: tuple[ClientFn, dict] | None = None,
    test: tuple[ClientFn, dict] | None = None,
) -> list[Record]:
    """accuracy/loss on the global test set (with FedRC's test clients: their mean, each on its held-out
    part), plus local_accuracy on clients' own test splits if they have them, and train_accuracy on
    their training splits: by `member_eval`, or by ``train`` (a client function and its message that
    give the same numbers from what the clients hold: FedConcat's kept features); ``test`` does the
    same for the global test set (`evaluate_global`)."""
    if fed.test_client_ids:
        records = test_client_records(
            fed.map(local_eval, fed.test_client_ids, model_msg(params, arch)), stage
        )
    else:
        g = evaluate_global(fed, params, arch, test)
        records = [rec("accuracy", g.accuracy, stage=stage), rec("loss", g.loss, stage=stage)]
    with_test = [c for c, n in fed.num_test_examples(fed.eval_client_ids).items() if n > 0]
    if with_test:
        records += own_data_records(
            fed, [(with_test, model_msg(params, arch))], local_eval, "local_accuracy", stage
        )
    fn, msg = train or (None, model_msg(params, arch))
    return records + train_split_records(fed, [(fed.eval_client_ids, msg)], fn, stage=stage)


def own_data_records(
    fed: Federation,
    groups: Sequence[tuple[Sequence[int], dict]],
    fn: ClientFn,
    metric: str,
    stage: str,
    per_group: bool = False,
) -> list[Record]:
    """Each group's clients evaluate the group's model message with ``fn`` (a reply of ``correct`` and
    ``samples``): ``metric`` per client, per group (scope cluster, entity = the group's index, with
    ``per_group``) and overall, sample-weighted."""
    replies = fed.map_groups(fn, [g for g in groups if g[0]])
    records = [
        rec(metric, r["correct"] / r["samples"], scope="client", entity=c, stage=stage)
        for c, r in replies.items()
    ]
    for k, (members, _) in enumerate(groups):
        if per_group and members:
            correct = sum(replies[c]["correct"] for c in members)
            records.append(
                rec(
                    metric,
                    correct / sum(replies[c]["samples"] for c in members),
                    scope="cluster",
                    entity=k,
                    stage=stage,
                )
            )
    correct = sum(r["correct"] for r in replies.values())
    records.append(rec(metric, correct / sum(r["samples"] for r in replies.values()), stage=stage))
    return records


def member_eval(client: Client, cstate: Any, msg: dict) -> Generator[Evaluation, EvalStats, tuple[dict, Any]]:
    """Client function: the received model on the client's own training data (no augmentation)."""
    stats = yield received_evaluation(msg, "train")
    return stats_reply(stats), cstate


def cluster_model_records(
    fed: Federation,
    models: Sequence[Params],
    assignment: Mapping[int, int],
    stage: str = "",
    members: bool = False,
) -> list[Record]:
    """Clustered models: each cluster's model on the global test set (``accuracy``/``loss``, scope
    cluster); where clients have test splits, each client with its cluster's model
    (``local_accuracy``, per client, per cluster and overall); with ``members``, each client with its
    cluster's model on its own training data (``member_accuracy``)."""
    records = [r for k, m in enumerate(models) for r in model_global_records(fed, m, k, stage)]

    def groups(cids: Sequence[int]) -> list[tuple[list[int], dict]]:
        return [([c for c in cids if assignment[c] == k], model_msg(m)) for k, m in enumerate(models)]

    with_test = [c for c, n in fed.num_test_examples(fed.eval_client_ids).items() if n > 0]
    if with_test:
        records += own_data_records(
            fed, groups(with_test), local_eval, "local_accuracy", stage, per_group=True
        )
    if members:
        records += own_data_records(
            fed, groups(fed.eval_client_ids), member_eval, "member_accuracy", stage, per_group=True
        )
    return records + train_split_records(fed, groups(fed.eval_client_ids), stage=stage)
