"""FedRC: Guo, Tang, Lin, "FedRC: Tackling Diverse Distribution Shifts Challenge in Federated
Learning by Robust Clustering", ICML 2024 (docs/algorithms/mixture.md#fedrc-and-fedem; docs/algorithms/mixture.md#paper-and-code-differences).

FedEM's mixture round (`fedray.algorithms.mixture`, as `fedem.py` runs it) with FedRC's label prior: the E-step divides by C_{y,k}, so a
sample is pushed towards the models that have seen its label least (concept shifts separate,
label skew does not). After each round the server sums every client's last reported per-class
gamma sums S_i (non-participants: their last report, or the initial 1/C), floors each sum at 1e-8
and normalises over the classes (the code, docs/algorithms/mixture.md#d7-label-prior-bookkeeping-and-local-sgd). Round 0 uses a constant prior, so it
is FedEM's round exactly.

Options: ``adam`` (FedRC-Adam, gamma moved by an Adam step towards the E-step result: ``paper``
constants b1 0.9, b2 0.99, or the ``code``'s 0.5, 0.5; docs/algorithms/mixture.md#d3-fedrc-adams-constants); ``delta`` > 0 (adaptive
removal, App. F: once the responsibilities have converged, i.e. no model's share of all of them
moved by more than ``removal_tol`` since the previous round, a model whose share is below delta is
dropped by the server and by every client, which renormalises its gamma; the code has it disabled,
docs/algorithms/mixture.md#d4-adaptive-model-removal); ``xi`` > 0 (each client adds N(0, xi^2) noise to the sums it reports; the paper suggests
25, the code uses 100; docs/algorithms/mixture.md#d6-privacy-noise); ``finetune`` (FedRC-FT: before evaluation each client fine-tunes
copies of the models for one epoch on its gamma-weighted loss and evaluates those: training
clients on their test splits, ``local_accuracy_ft``; the shift preset's test clients, after their
E-step, on their held-out parts, ``accuracy_ft`` and ``loss_ft``, as the code's
``--locally_tune_clients``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from fedray.algorithms import mixture
from fedray.algorithms.evaluation import test_client_records
from fedray.algorithms.mixture import ensemble
from fedray.algorithms.mixture.client import aligned
from fedray.algorithms.mixture.fedem import (
    MixtureHparams,
    MixtureState,
    init,
    mixture_round,
    models,
    update_test_clients,
)
from fedray.config.hparams import bound, one_of
from fedray.engine.client import Client
from fedray.engine.update import LocalUpdate
from fedray.federation import Federation
from fedray.records import Record, rec

ADAM = {"off": None, "paper": mixture.PAPER_ADAM, "code": mixture.CODE_ADAM}


@dataclass
class Hparams(MixtureHparams):
    # FedRC-Adam: off | paper (b1 0.9, b2 0.99) | code (b1 = b2 = 0.5)
    adam: str = field(default="off", metadata=one_of(*ADAM))
    # adaptive removal threshold on a model's share of all gamma (0 = no removal; paper 0.05)
    delta: float = field(default=0.0, metadata=bound(ge=0, lt=1))
    # removal waits until no model's share of all responsibilities moved by more than this in a round
    removal_tol: float = field(default=0.01, metadata=bound(gt=0))
    # std of the Gaussian noise on the reported per-class gamma sums (0 = off; paper 25)
    xi: float = field(default=0.0, metadata=bound(ge=0))
    finetune: bool = False  # FedRC-FT: one gamma-weighted epoch on copies before evaluation
    label_prior: bool = True  # False: no C_{y,k} (FedEM)


State = MixtureState  # the K models and the label prior: prior, stats, shares

__all__ = ["Hparams", "State", "init", "models", "round", "evaluate"]


def summed_stats(state: State, fed: Federation, ids: list[int]) -> np.ndarray:
    """sum_i S_i over all clients, K x C: each client's last report, or 1/C per class before its first."""
    c = fed.task.spec.num_classes
    total = np.zeros((len(ids), c))
    for cid in fed.client_ids:
        total += state.stats[cid] if cid in state.stats else np.full((len(ids), c), 1.0 / c)
    return total


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    extra = {"prior": state.prior if hp.label_prior else None, "adam": ADAM[hp.adam], "xi": hp.xi}
    new, records, replies = mixture_round(state, fed, hp, rnd, extra)
    stats = {**state.stats, **{c: r["stats"] for c, r in replies.items()}}
    ids = sorted(new.models)
    total = summed_stats(replace(new, stats=stats), fed, ids)
    share = total.sum(axis=1) / total.sum()
    converged = (
        state.shares is not None
        and len(state.shares) == len(share)
        and (np.abs(share - state.shares).max() <= hp.removal_tol)
    )
    new = replace(new, shares=share)
    if hp.delta > 0 and converged:
        keep = mixture.models_to_keep(total.sum(axis=1), hp.delta)
        if not keep.all():
            gone = [i for i, k in zip(ids, keep, strict=True) if not k]
            records += [rec("removed", 1, scope="cluster", entity=i) for i in gone]
            ids = [i for i, k in zip(ids, keep, strict=True) if k]
            new = replace(new, models={i: new.models[i] for i in ids})
            stats = {c: s[keep] for c, s in stats.items()}
            total = total[keep]
            new = replace(new, shares=None)  # the shares of the models left start converging anew
    new = replace(new, stats=stats, prior=mixture.label_prior(total))
    update_test_clients(fed, new)
    return new, records


def finetuned_eval(client: Client, cstate: Any, msg: dict):
    """Client function (FedRC-FT): copies of the live models fine-tuned for one epoch on the client's
    gamma-weighted loss, then its ensemble on its test split. The client's state is unchanged."""
    state = aligned(cstate, msg["ids"], client.num_examples)
    live = [row for row in range(len(msg["models"])) if state.omega[row] > 0]
    updates = [LocalUpdate(msg["models"][r], msg["round"], epochs=1, weights=state.gamma[r]) for r in live]
    trained = (yield updates) if updates else []
    tuned = list(msg["models"])
    for r, t in zip(live, trained, strict=True):
        tuned[r] = t.params
    return (yield from ensemble.ensemble_eval(client, state, tuned, msg["hard"], "test")), cstate


def evaluate(state: State, fed: Federation, hp: Hparams, rnd: int) -> list[Record]:
    records = ensemble.evaluate(fed, state.models, hp.hard_predict, rnd)
    if hp.finetune:  # after FedEM's evaluation: test clients fine-tune with the gamma of its E-step
        ids = sorted(state.models)
        with_test = [c for c, k in fed.num_test_examples(fed.eval_client_ids).items() if k > 0]
        msg = {
            "ids": ids,
            "models": [state.models[i] for i in ids],
            "hard": hp.hard_predict,
            "round": rnd,
        }
        tuned = fed.map(finetuned_eval, with_test, msg)
        records.append(
            rec(
                "local_accuracy_ft",
                sum(r["correct"] for r in tuned.values()) / max(1, sum(r["samples"] for r in tuned.values())),
            )
        )
        if fed.test_client_ids:  # FedRC-FT's global accuracy: the test clients tune too
            records += [
                {**r, "metric": f"{r['metric']}_ft"}
                for r in test_client_records(fed.map(finetuned_eval, fed.test_client_ids, msg))
            ]
    return records
