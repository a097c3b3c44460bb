"""Evaluating a mixture of K models: the omega-weighted softmax ensemble (``hard``: the argmax-omega
model's prediction) on the clients' splits, on the global test set and on the shift preset's test
clients (docs/algorithms/mixture.md#procedure, evaluation protocol; FedEM and FedRC).

``accuracy`` is the ensemble on the global test set with the population's omega (the size-weighted
mean of the clients' omega); with the shift preset's test clients it is their mean accuracy, each
with the omega of its latest E-step (`fedray.algorithms.mixture.fedem.update_test_clients`) on its 10%.
``local_accuracy`` is each client's ensemble on its test split, ``train_accuracy`` on its training
split (pooled; FedRC reads its numbers at the round of best train accuracy).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any

import numpy as np

from fedray.algorithms import mixture
from fedray.algorithms.clustering import purity
from fedray.algorithms.evaluation import test_client_records
from fedray.algorithms.mixture.client import ClientMixture, aligned, report_omega
from fedray.engine.client import Client
from fedray.engine.update import Evaluation
from fedray.federation import Federation
from fedray.params import Params
from fedray.records import Record, rec


def ensemble_asked(models: list[Params], split: str, per_sample: str = "proba") -> list[Evaluation]:
    """The evaluations an ensemble on the client's ``split`` needs: each model's probabilities
    (``loss_proba``: with its losses, from the same pass)."""
    return [Evaluation(p, split, per_sample=per_sample) for p in models]


def split_labels(client: Client, split: str) -> np.ndarray:
    """The labels of the client's ``split``, in the order its evaluations give their samples."""
    return client.train_labels() if split == "train" else client.test_labels()


def ensemble_stats(state: ClientMixture, probas: list[np.ndarray], labels: np.ndarray, hard: bool) -> dict:
    """Correct predictions and summed NLL of the omega-weighted softmax ensemble of the models'
    probabilities ``probas`` (each n x classes) against ``labels``."""
    p = mixture.ensemble_proba(np.stack(probas), state.omega, hard)
    return {
        "correct": int((p.argmax(1) == labels).sum()),
        "samples": len(labels),
        "loss_sum": float(-np.log(np.maximum(p[np.arange(len(labels)), labels], 1e-12)).sum()),
    }


def ensemble_eval(client: Client, state: ClientMixture, models: list[Params], hard: bool, split: str):
    """The ensemble on the client's ``split`` (``"train"`` or ``"test"``): `ensemble_stats`, from the
    models' probabilities, yielded (`fedray.Evaluation`)."""
    probas = yield ensemble_asked(models, split)
    return ensemble_stats(state, probas, split_labels(client, split), hard)


def own_ensemble_eval(client: Client, cstate: Any, msg: dict) -> Generator[Any, Any, tuple[dict, Any]]:
    """Client function: the client's ensemble (its omega) on its training split and, if it has one,
    its test split (FedRC's train and local accuracy), both asked at once. Where the message names
    the round that sends these models next (``keep_for``), the models' per-sample losses on the
    training split come from the same pass and are kept in the client's state for that round's
    E-step (`fedray.algorithms.mixture.client.e_step`); the state is otherwise unchanged."""
    state = aligned(cstate, msg["ids"], client.num_examples)
    keep = msg.get("keep_for") is not None and cstate is not None  # a client that never trained: none
    splits = ["train", "test"] if client.num_test_examples else ["train"]
    kinds = {"train": "loss_proba" if keep else "proba", "test": "proba"}
    probas = yield [e for split in splits for e in ensemble_asked(msg["models"], split, kinds[split])]
    k = len(msg["models"])
    if keep:  # the training split's (losses, probabilities) pairs
        losses = np.stack([pair[0] for pair in probas[:k]])
        probas = [pair[1] for pair in probas[:k]] + probas[k:]
    out = {}
    for j, split in enumerate(splits):
        out[split] = ensemble_stats(
            state, probas[j * k : (j + 1) * k], split_labels(client, split), msg["hard"]
        )
    if keep:
        return out, dataclasses.replace(state, next_losses=losses, next_round=msg["keep_for"])
    return out, cstate


def global_ensemble_eval(client: Client, cstate: Any, msg: dict) -> Generator[Any, Any, tuple[list, Any]]:
    """test_map function: the ensemble with the population's omega on a shard of the global test set."""
    state = ClientMixture(msg["ids"], np.zeros((0, 0)), np.asarray(msg["omega"]))
    return [(yield from ensemble_eval(client, state, msg["models"], msg["hard"], "test"))], cstate


def test_client_eval(client: Client, cstate: Any, msg: dict) -> Generator[Any, Any, tuple[dict, Any]]:
    """Client function for a test client (FedEM, FedRC): its ensemble (the omega of its latest
    E-step) on its scored split (the shift preset's 10%, a client file's x_test). State unchanged."""
    state = aligned(cstate, msg["ids"], client.num_examples)
    return (yield from ensemble_eval(client, state, msg["models"], msg["hard"], "test")), cstate


def pooled(replies: dict, part: str) -> float:
    got = [r[part] for r in replies.values() if part in r]
    return sum(g["correct"] for g in got) / max(1, sum(g["samples"] for g in got))


def evaluate(fed: Federation, live: dict[int, Params], hard: bool, rnd: int | None = None) -> list[Record]:
    """The records of an evaluation of the live models ``live`` (model id -> weights) after round
    ``rnd``: accuracy and loss, train_accuracy and train_loss, local_accuracy (per client and
    pooled) where clients have test splits, purity where the clients' groups are known, live_models.
    Where every client takes part in every round, the clients keep their training splits' losses
    for round ``rnd`` + 1's E-step (`own_ensemble_eval`)."""
    ids = sorted(live)
    models = [live[i] for i in ids]
    omega = fed.map(report_omega, fed.client_ids, {"ids": ids})
    if fed.test_client_ids:
        msg = {"ids": ids, "models": models, "hard": hard}
        records = test_client_records(fed.map(test_client_eval, fed.test_client_ids, msg))
    else:
        n = fed.num_examples()
        population = sum(n[c] * omega[c] for c in omega) / sum(n.values())
        msg = {"ids": ids, "models": models, "omega": population, "hard": hard}
        parts = fed.test_map(global_ensemble_eval, msg)
        samples = sum(p["samples"] for p in parts)
        records = [
            rec("accuracy", sum(p["correct"] for p in parts) / samples),
            rec("loss", sum(p["loss_sum"] for p in parts) / samples),
        ]
    keep_for = rnd + 1 if rnd is not None and fed.task.participation >= 1.0 else None
    msg = {"ids": ids, "models": models, "hard": hard, "keep_for": keep_for}
    own = fed.map(own_ensemble_eval, fed.eval_client_ids, msg)
    records.append(rec("train_accuracy", pooled(own, "train")))  # FedRC's, to pick the reported round
    records.append(
        rec(
            "train_loss",
            sum(r["train"]["loss_sum"] for r in own.values())
            / max(1, sum(r["train"]["samples"] for r in own.values())),
        )
    )
    if any("test" in r for r in own.values()):
        records += [
            rec("local_accuracy", r["test"]["correct"] / r["test"]["samples"], scope="client", entity=c)
            for c, r in own.items()
            if "test" in r
        ]
        records.append(rec("local_accuracy", pooled(own, "test")))
    if fed.groups is not None:
        records.append(rec("purity", purity({c: int(np.argmax(w)) for c, w in omega.items()}, fed.groups)))
    records += [rec("live_models", len(ids))]
    return records
