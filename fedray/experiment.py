"""The round loop. It exists once, here; the Ray coordinator actor and ``--local`` both drive it.

`execute` loads and partitions the data, builds a federation through the factory it is given,
runs the algorithm's rounds, evaluates every ``eval_every`` rounds and streams every record to the
`ResultsWriter`. It yields progress events; the caller prints them.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fedray.algorithms import ALGORITHMS
from fedray.config import Config
from fedray.data import FederatedData, build_federated_data
from fedray.federation import Federation
from fedray.records import Record, rec
from fedray.results import ResultsWriter


@dataclass
class Started:
    run_id: str
    num_clients: int
    placement: dict[str, Any]


@dataclass
class RoundDone:
    round: int
    rounds: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)  # the round's global-scope values, by metric
    stage: str = ""  # the stage the round ran in (multi-stage algorithms)


@dataclass
class Finished:
    run_id: str
    summary: dict[str, Any]


Event = Started | RoundDone | Finished
FederationFactory = Callable[[Config, FederatedData], tuple[Federation, dict[str, Any]]]


def _global(records: list[Record]) -> dict[str, float]:
    # One round runs in one stage, so the metric name is enough (assignment rows have no scope).
    return {r["metric"]: r["value"] for r in records if r.get("scope") == "global"}


def run_rounds(cfg: Config, fed: Federation, writer: ResultsWriter) -> Iterator[RoundDone]:
    alg = ALGORITHMS[cfg.algorithm]
    hp = alg.make_hparams(cfg.hp)
    state = alg.init(fed, hp)
    fed.take_traffic()
    for rnd in range(cfg.rounds):
        # A multi-stage algorithm keeps its stage in State (DESIGN §2); the round's own rows carry
        # the stage the round ran in, so `fedray report --stage S --round R` can count its rounds.
        stage = getattr(state, "stage", "")
        t0 = time.perf_counter()
        state, records = alg.round(state, fed, hp, rnd)
        seconds = time.perf_counter() - t0
        traffic = fed.take_traffic()
        records = [
            *records,
            rec("bytes_down", traffic.down, stage=stage),
            rec("bytes_up", traffic.up, stage=stage),
            rec("bytes_received", traffic.received, stage=stage),
            rec("seconds", seconds, stage=stage),
        ]
        # Evaluated: every eval_every rounds, the last round, the last round of every stage, and
        # where the algorithm asks (FedCat after each aggregation).
        stage_ends = getattr(state, "stage", "") != stage
        asked = alg.evaluate_after is not None and alg.evaluate_after(state, hp, rnd)
        if (rnd + 1) % cfg.eval_every == 0 or rnd + 1 == cfg.rounds or stage_ends or asked:
            t1 = time.perf_counter()
            records += alg.evaluate(state, fed, hp, rnd)
            fed.take_traffic()  # evaluation traffic is not training traffic
            records.append(rec("eval_seconds", time.perf_counter() - t1, stage=stage))
        writer.add(rnd + 1, records)
        yield RoundDone(rnd + 1, cfg.rounds, seconds, _global(records), stage)


def client_rows(data: FederatedData) -> list[dict[str, Any]]:
    """One row per client for ``DIR/clients/``: its role, sizes, ground-truth group and shift."""
    from fedray.data.shift import CONCEPTS

    rows = []
    for cid, ix in sorted(data.clients.items()):
        s = data.shifts[cid] if data.shifts else None
        test = cid in data.test_clients
        group = s.concept if s else (int(data.groups[cid]) if data.groups is not None else -1)
        rows.append({"client": cid, "role": "test" if test else "train", "num_train": len(ix.train),
                     "num_test": len(ix.test), "group": group, "concept": CONCEPTS[s.concept] if s else "",
                     "corruption": s.corruption if s else "", "severity": s.severity if s else 0})  # fmt: skip
    return rows


def summarize(history: list[RoundDone], total_seconds: float, placement: dict[str, Any]) -> dict[str, Any]:
    acc = [(h.round, h.metrics["accuracy"]) for h in history if "accuracy" in h.metrics]
    seconds = [h.seconds for h in history]
    out: dict[str, Any] = {
        "rounds_done": len(history),
        "total_seconds": total_seconds,
        "placement": placement,
    }
    if seconds:
        out["mean_round_seconds"] = sum(seconds) / len(seconds)
        steady = seconds[1:] or seconds  # the first round pays for warm-up (actor imports, caches)
        out["steady_round_seconds"] = sum(steady) / len(steady)
    if acc:
        out["final_accuracy"] = acc[-1][1]
        best = max(acc, key=lambda a: a[1])
        out["best_accuracy"], out["best_round"] = best[1], best[0]
    return out


def execute(cfg: Config, make_federation: FederationFactory) -> Iterator[Event]:
    """Run one experiment end to end; the results writer records success or the failure."""
    run_id = cfg.run_id()
    writer = ResultsWriter(cfg.output, run_id, cfg.to_dict())
    writer.start()
    t0 = time.perf_counter()
    fed = None
    history: list[RoundDone] = []
    placement: dict[str, Any] = {}
    try:
        data = build_federated_data(cfg)
        writer.write_clients(client_rows(data))
        fed, placement = make_federation(cfg, data)
        yield Started(run_id, len(data.clients) - len(data.test_clients), placement)  # training clients
        for ev in run_rounds(cfg, fed, writer):
            if not all(math.isfinite(v) for v in ev.metrics.values()):
                bad = {k: v for k, v in ev.metrics.items() if not math.isfinite(v)}
                raise FloatingPointError(f"round {ev.round}: non-finite metrics {bad} (diverged? lower lr)")
            history.append(ev)
            yield ev
        summary = summarize(history, time.perf_counter() - t0, placement)
        summary["hparams"] = ALGORITHMS[cfg.algorithm].full_hparams(cfg.hp)
        writer.finish(summary)
        yield Finished(run_id, summary)
    except BaseException as e:
        status = "failed"
        if isinstance(e, (GeneratorExit, KeyboardInterrupt)):  # the consumer stopped: Ctrl-C, job stopped
            status, error = "interrupted", f"interrupted after {len(history)} of {cfg.rounds} rounds"
        else:
            error = f"{type(e).__name__}: {e}\n{getattr(e, 'remote_traceback', '') or traceback.format_exc()}"
        writer.fail(error, summarize(history, time.perf_counter() - t0, placement), status)
        raise
    finally:
        if fed is not None:
            fed.close()
