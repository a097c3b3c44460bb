"""The round loop. It exists once, here; the Ray coordinator actor and ``--local`` both drive it.

`execute` loads and partitions the data, builds a federation through the factory it is given,
runs the algorithm's rounds, evaluates every ``eval_every`` rounds and streams every record to the
`ResultsWriter`. It yields progress events; the caller prints them.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fedray.algorithms import ALGORITHMS
from fedray.config.keys import Config
from fedray.data import FederatedData, build_federated_data, partition_label
from fedray.data.identity import DataChanged, changes, identity
from fedray.experiment.checks import unread_keys
from fedray.experiment.same_data import finished_refusal, resume_refusal
from fedray.federation import Baton, Federation, WorkerLost
from fedray.records import Record, rec, validation_named
from fedray.storage.blobs import CheckpointError
from fedray.storage.checkpoint import Checkpoint, Checkpoints, written_format
from fedray.storage.export import check_shapes, save_models
from fedray.storage.files import refuse_link
from fedray.storage.loggers import Loggers, RunInfo
from fedray.storage.loggers.base import read_setting
from fedray.storage.results import failure_text, models_folder, versions
from fedray.storage.writer import ResultsWriter


@dataclass
class Started:
    run_id: str
    num_clients: int
    placement: dict[str, Any]
    resumed_from: int = 0  # rounds already done: the checkpoint the run goes on from (0: from the start)
    # Where the start went (jobs/bench/headline.py): "begun" (wall clock when execute began), and seconds for
    # "data" (load + partition) and "federation" (workers ready, data and clients handed out).
    timings: dict[str, float] = field(default_factory=dict)


@dataclass
class RoundDone:
    round: int
    rounds: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)  # the round's global-scope values, by metric
    stage: str = ""  # the stage the round ran in (multi-stage algorithms)
    batched_calls: int = 0  # client calls of the round (its evaluation too) whose training ran stacked
    packed_calls: int = 0  # ... of those, stacked with another run's clients (a pack, fedray/sweeps/pack.py)


@dataclass
class Checkpointed:
    round: int
    seconds: float
    bytes: int


@dataclass
class Recovered:
    """Client actors were lost; the run starts again on new ones from its latest checkpoint."""

    run_id: str
    failures: int  # recoveries so far, this one included
    max_failures: int
    error: str
    actors: int  # the actors it goes on with


@dataclass
class Stopped:
    """The run stopped where it was asked to (``execute``'s ``stop_at``: a search's successive
    halving), before its budget: recorded ``stopped`` at ``round``, its rows of every round it ran
    written, a checkpoint there to go on from if it is asked to go further."""

    run_id: str
    round: int
    summary: dict[str, Any]


@dataclass
class Finished:
    run_id: str
    summary: dict[str, Any]
    # found finished, by another process since the caller looked (another sweep over the same
    # runs): nothing was run here
    already: bool = False


Event = Started | RoundDone | Checkpointed | Recovered | Stopped | Finished


class HostedFederation(Federation, Protocol):
    """A Federation as the round loop holds it: the algorithm's calls, plus what checkpoints, resume,
    saved personal models and shutdown need. Algorithms never see these."""

    def client_states(self, files: bool = False) -> Iterator[tuple[int, Any]]:
        """Every hosted client's persistent state (test clients too), in client order, one at a time;
        clients without state are left out. ``files``: a state spilled to a file this process can
        reach comes as that file (`fedray.storage.blobs.StateFile`), which a checkpoint links."""

    def restore_client_states(self, states: Iterable[tuple[int, Any]]) -> None:
        """Give clients back the states `client_states` produced (in a new federation: a resumed run)."""

    def take_client_seconds(self) -> float:
        """Seconds the clients spent in their client functions since the last call, summed over the
        calls, then reset: what a round cost beyond its clients' own work is the rest."""

    def take_batched_calls(self) -> int:
        """Client calls since the last call whose training ran in the stacked engine, then reset."""

    def take_packed_calls(self) -> int:
        """Of those, the calls stacked with another run's clients (a pack, fedray/sweeps/pack.py), then reset."""

    def peek_baton(self, baton: Baton) -> Any:
        """The value behind ``baton``, which stays usable (a checkpoint of a State holding Batons)."""

    def restore_baton(self, key: int, value: Any) -> Baton:
        """Put ``value`` back behind a Baton with ``key`` (the State being restored names it)."""

    def close(self) -> None:
        """Release workers (actors, placement group); the federation is unusable afterwards."""


FederationFactory = Callable[[Config, FederatedData], tuple[HostedFederation, dict[str, Any]]]
Saver = Callable[[int, Any], Checkpointed]


def _global(records: list[Record]) -> dict[str, float]:
    # One round runs in one stage, so the metric name is enough (assignment rows have no scope).
    return {r["metric"]: r["value"] for r in records if r.get("scope") == "global"}


def checkpoint_due(cfg: Config, rounds_done: int) -> bool:
    every = cfg.checkpoint_every
    return every > 0 and (rounds_done % every == 0 or rounds_done == cfg.rounds)


def run_rounds(
    cfg: Config,
    fed: Federation,
    writer: ResultsWriter,
    state: Any,
    start: int = 0,
    save: Saver | None = None,
    on_round: Callable[[int, list[Record]], None] | None = None,
    until: int | None = None,
) -> Generator[RoundDone | Checkpointed, None, Any]:
    """Rounds ``start`` .. ``until - 1`` (``until``: ``cfg.rounds`` where None) from ``state``;
    returns the last State. ``save(rounds_done, state)`` checkpoints, after the round's rows are on
    disk (so a checkpoint never runs ahead of the metrics), where due and after the last round run
    (a run stopped at ``until`` goes on from there); ``on_round(round, records)`` is told each
    round's records as they are written (the live loggers)."""
    alg = ALGORITHMS[cfg.algorithm]
    hp = alg.make_hparams(cfg.hp)
    until = cfg.rounds if until is None else min(until, cfg.rounds)
    for rnd in range(start, until):
        # A multi-stage algorithm keeps its stage in State (docs/architecture.md#the-round-loop); the round's own rows carry
        # the stage the round ran in, so `fedray report --stage S --round R` can count its rounds.
        stage = getattr(state, "stage", "")
        t0 = time.perf_counter()
        state, records = alg.round(state, fed, hp, rnd)
        seconds = time.perf_counter() - t0
        if rnd == start:  # the models an algorithm (a plug-in's, say) made fit the run's model
            check_shapes(cfg.algorithm, alg.models(state, hp), fed.task, f"after round {rnd + 1}")
        traffic = fed.take_traffic()
        records = [
            *records,
            rec("bytes_down", traffic.down, stage=stage),
            rec("bytes_up", traffic.up, stage=stage),
            rec("bytes_received", traffic.received, stage=stage),
            rec("seconds", seconds, stage=stage),
            rec("client_seconds", fed.take_client_seconds(), stage=stage),
        ]
        # Evaluated: every eval_every rounds, the last round, the last round of every stage, and
        # where the algorithm asks (FedCat after each aggregation).
        stage_ends = getattr(state, "stage", "") != stage
        asked = alg.evaluate_after is not None and alg.evaluate_after(state, hp, rnd)
        if (rnd + 1) % cfg.eval_every == 0 or rnd + 1 == cfg.rounds or stage_ends or asked:
            t1 = time.perf_counter()
            evaluated = alg.evaluate(state, fed, hp, rnd)
            records += validation_named(evaluated) if cfg.evaluate_on == "validation" else evaluated
            fed.take_traffic()  # evaluation traffic is not training traffic
            fed.take_client_seconds()
            records.append(rec("eval_seconds", time.perf_counter() - t1, stage=stage))
        writer.add(rnd + 1, records)
        if on_round is not None:
            on_round(rnd + 1, records)
        calls = (fed.take_batched_calls(), fed.take_packed_calls())
        yield RoundDone(rnd + 1, cfg.rounds, seconds, _global(records), stage, *calls)
        if save is not None and (checkpoint_due(cfg, rnd + 1) or rnd + 1 == until):
            writer.flush()
            yield save(rnd + 1, state)
    return state


def client_rows(data: FederatedData) -> dict[str, Any]:
    """``DIR/clients/``'s columns, one entry per client: its role, sizes, ground-truth group and
    shift. Columns, not rows: a million clients made on demand are a few arrays here."""
    from fedray.data.shift import CONCEPTS

    if data.sourced:  # no groups, shifts or test clients: the sizes alone, straight from the source
        ids, n_train, n_test = data.clients.sizes()
        n = len(ids)
        return {
            "client": ids,
            "role": np.full(n, "train", dtype=object),
            "num_train": n_train,
            "num_test": n_test,
            "group": np.full(n, -1),
            "concept": np.full(n, "", dtype=object),
            "corruption": np.full(n, "", dtype=object),
            "severity": np.zeros(n, np.int64),
        }
    rows = []
    for cid, ix in sorted(data.clients.items()):
        s = data.shifts[cid] if data.shifts else None
        test = cid in data.test_clients
        group = (
            s.concept
            if s
            else (int(data.groups[cid]) if data.groups is not None and cid < len(data.groups) else -1)
        )
        rows.append(
            {
                "client": cid,
                "role": "test" if test else "train",
                "num_train": len(ix.train),
                "num_test": len(ix.test),
                "group": group,
                "concept": CONCEPTS[s.concept] if s else "",
                "corruption": s.corruption if s else "",
                "severity": s.severity if s else 0,
            }
        )
    return {k: [r[k] for r in rows] for k in rows[0]} if rows else {}


def summarize(history: list[RoundDone], total_seconds: float, placement: dict[str, Any]) -> dict[str, Any]:
    seconds = [h.seconds for h in history]
    out: dict[str, Any] = {
        "rounds_done": len(history),
        "total_seconds": total_seconds,
        "placement": placement,
        # client calls whose training ran in the stacked engine (0: every client trained on its own)
        "batched_calls": sum(h.batched_calls for h in history),
        # of those, calls stacked with another run's clients (pack_runs, fedray/sweeps/pack.py)
        "packed_calls": sum(h.packed_calls for h in history),
    }
    if seconds:
        out["mean_round_seconds"] = sum(seconds) / len(seconds)
        steady = seconds[1:] or seconds  # the first round pays for warm-up (actor imports, caches)
        out["steady_round_seconds"] = sum(steady) / len(steady)
    for metric in ("accuracy", "val_accuracy"):  # on test, or on validation (evaluate_on)
        acc = [(h.round, h.metrics[metric]) for h in history if metric in h.metrics]
        if acc:
            best = max(acc, key=lambda a: a[1])
            out[f"final_{metric}"], out[f"best_{metric}"] = acc[-1][1], best[1]
            out["best_round" if metric == "accuracy" else "best_val_round"] = best[0]
    return out


def _rounds_text(rounds: list[int]) -> str:
    """``[1, 2, 3, 5]`` as ``1-3, 5``."""
    spans: list[list[int]] = []
    for r in rounds:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


@dataclass
class _Run:
    """One attempt at a run, as `execute` goes through it: what it writes to, what it has built and
    the rounds done so far."""

    cfg: Config
    writer: ResultsWriter
    ckpts: Checkpoints
    fed: Any = None
    placement: dict[str, Any] = field(default_factory=dict)
    history: list[RoundDone] = field(default_factory=list)
    loggers: Loggers | None = None  # the live loggers (config key loggers), from the run's start
    timings: dict[str, float] = field(default_factory=lambda: {"begun": time.time()})

    def summary(self) -> dict[str, Any]:
        return summarize(self.history, self.writer.elapsed(), self.placement)

    def start(
        self, make_federation: FederationFactory, restart: bool, reason: str
    ) -> tuple[Any, Any, Any, int]:
        """The data loaded, the federation built, the algorithm's State made or restored from the
        latest checkpoint (its files verified before any data is read); the rows of the earlier
        attempt's later rounds removed only then. Returns the algorithm, its hyperparameters, the
        State and the rounds already done."""
        cfg, writer = self.cfg, self.writer
        # what a killed attempt left (a half-done prune, hidden temporary files) goes first; a
        # symbolic link where the run keeps its checkpoints or models is refused before anything runs
        self.ckpts.tidy()
        self.writer.tidy()
        refuse_link(models_folder(cfg.output, self.writer.run_id), "the run's models folder")
        if restart:
            self.ckpts.clear()
        # the format this run's checkpoints were written in, as its row says (none: written before
        # rows said it): an older one in its folder is a relabelled one
        latest = self.ckpts.latest(written_format(self.writer.earlier_summary))
        section = cfg.data_section
        now = identity(section)
        if latest is not None:  # before any data is read
            self.check_rows(latest.round)
            self.check_data(latest, now)
        t0 = time.perf_counter()
        data = build_federated_data(section)
        if now is None:  # its files there only now (downloaded as the data was built)
            now = identity(section)
            if now is not None and latest is not None:
                self.check_data(latest, now)
        writer.data = now
        t1 = time.perf_counter()
        self.fed, self.placement = make_federation(cfg, data)
        self.timings.update(data=t1 - t0, federation=time.perf_counter() - t1)
        alg = ALGORITHMS[cfg.algorithm]
        hp = alg.make_hparams(cfg.hp)
        if latest is None:
            state, start = alg.init(self.fed, hp), 0
        else:
            state, start = restore(self.ckpts, latest, self.fed), latest.round
            self.history = [RoundDone(**h) for h in latest.extra["history"]]
        writer.start(keep_through=None if latest is None else start)
        self.loggers = Loggers(cfg.loggers, self.logged(start, continued=not restart))
        writer.write_clients(client_rows(data))
        if not data.sourced:  # clients made on demand are in no data set's arrays: no partition to write
            train_size = data.origin_train_size if data.origin is not None else len(data.dataset.train)
            writer.write_partition(data.partition_rows(), train_size, cfg.dataset)
        if latest is not None:
            writer.set_elapsed(latest.extra["elapsed"])
            older = (
                ""
                if latest.owners
                else f" (its checkpoint of format {latest.format}: files naming no owner read)"
            )
            writer.event("resumed", start, (reason or "started again") + older)
            writer.write_progress(self.summary())
        self.fed.take_traffic()
        self.fed.take_client_seconds()
        self.fed.take_batched_calls()
        self.fed.take_packed_calls()
        return alg, hp, state, start

    def logged(self, start: int, continued: bool = False) -> RunInfo:
        """What the live loggers are told of the run (`fedray.storage.loggers`)."""
        cfg = self.cfg
        options = {"mlflow_tracking_uri": cfg.mlflow_tracking_uri, "wandb_project": cfg.wandb_project}
        hparams = ALGORITHMS[cfg.algorithm].full_hparams(cfg.hp)  # defaults included: shown as params
        launched = read_setting(cfg.output, self.writer.run_id)  # by a sweep or a search: how it is shown
        # the keys the run reads: none its partition or dataset leaves unread (partition_beta on a
        # label partition), which a logger would show as the run's params
        unread = unread_keys(cfg.to_dict(), include_defaults=True)
        return RunInfo(
            self.writer.run_id,
            cfg.experiment,
            cfg.output,
            {k: v for k, v in cfg.recorded().items() if k not in unread},
            start,
            options,
            hparams=hparams,
            continued=continued,
            started=time.time(),
            **launched,
        )

    def check_rows(self, rounds_done: int) -> None:
        """A run goes on from its checkpoint only where the metric rows of the rounds before it are
        there: else it would be recorded finished with rounds missing from its results (a results
        folder copied with its checkpoints but not its metrics), and its summary would give figures
        of rows that do not exist."""
        missing = sorted(set(range(1, rounds_done + 1)) - self.writer.rounds_on_disk())
        if missing:
            raise CheckpointError(
                f"run {self.writer.run_id}: its checkpoint goes on after round {rounds_done}, but "
                f"{self.cfg.output}/metrics/ holds no rows of rounds {_rounds_text(missing)} (a results folder "
                "copied without its metrics?): going on would record it finished without them. Put the "
                "metrics back, or start over with --restart"
            )

    def check_data(self, latest: Checkpoint, now: dict[str, Any] | None) -> None:
        """A run goes on from its checkpoint only on the data its rounds so far read (the checkpoint
        records it, `fedray.data.identity`): else its rounds would mix two data sets."""
        said = changes(latest.extra.get("data"), now)
        if said is not None:
            raise DataChanged(resume_refusal(self.writer.run_id, self.cfg.output, latest.round, said))

    def save(self, rounds_done: int, state: Any) -> Checkpointed:
        """A checkpoint after ``rounds_done`` rounds, with the history, the time so far and what the
        data is."""
        extra = {
            "history": [dataclasses.asdict(h) for h in self.history],
            "elapsed": self.writer.elapsed(),
            "data": self.writer.data,
        }
        fed = self.fed
        st = self.ckpts.save(
            rounds_done, state, fed.client_states(files=True), fed.peek_baton, extra, versions()
        )
        return Checkpointed(st.round, st.seconds, st.bytes)

    def rounds(self, state: Any, start: int, until: int | None = None) -> Generator[Event, None, Any]:
        """The rounds from ``start`` to ``until`` (`run_rounds`), each round's global values checked
        finite; returns the last State."""
        # a run that stops before its budget is paused, not ended: its checkpoint there is what it goes
        # on from, checkpoint_every or not
        stops = until is not None and until < self.cfg.rounds
        save = self.save if self.cfg.checkpoint_every > 0 or stops else None
        on_round = self.loggers.log_round if self.loggers is not None else None
        rounds = run_rounds(self.cfg, self.fed, self.writer, state, start, save, on_round, until)
        while True:
            try:
                ev = next(rounds)
            except StopIteration as stop:
                return stop.value
            if isinstance(ev, RoundDone):
                if not all(math.isfinite(v) for v in ev.metrics.values()):
                    bad = {k: v for k, v in ev.metrics.items() if not math.isfinite(v)}
                    raise FloatingPointError(
                        f"round {ev.round}: non-finite metrics {bad} (diverged? lower lr)"
                    )
                self.history.append(ev)
            yield ev

    def finish(self, alg: Any, hp: Any, state: Any) -> dict[str, Any]:
        """The summary (every hyperparameter, the partition's label, where the models went) and the
        run recorded finished; returns the summary."""
        cfg = self.cfg
        summary = self.summary()
        summary["hparams"] = alg.full_hparams(cfg.hp)
        # as reports name the partition: a plug-in's label, where its registry is loaded (here)
        summary["partition_label"] = partition_label(cfg.to_dict())
        if cfg.save_models:
            saved = save_models(
                cfg.output, cfg.to_dict(), alg, hp, state, self.fed.task, self.fed.client_states
            )
            summary["models"] = str(saved)
        # keep_finished_checkpoints: false: removed once the run is recorded finished (a run stopped
        # before then resumes from them), under its lock (no other process resumes from half of one)
        self.writer.finish(summary, then=None if cfg.keep_finished_checkpoints else self.ckpts.clear)
        if self.loggers is not None:
            self.loggers.end("finished")
        return summary

    def stop(self, by: str) -> Stopped:
        """Record the run ``stopped`` after the rounds it ran (``by``: who asked, noted with the
        event), its rows flushed; its checkpoint there stays for a later call to go on from."""
        done = self.history[-1].round if self.history else 0
        summary = self.summary()
        self.writer.event("stopped", done, by)
        self.writer.stop(f"stopped after {done} of {self.cfg.rounds} rounds ({by or 'asked to'})", summary)
        if self.loggers is not None:
            self.loggers.end("stopped")
        return Stopped(self.writer.run_id, done, summary)

    def ended(self, e: BaseException, failures_left: int) -> None:
        """Record how the attempt ended: interrupted (the consumer stopped: Ctrl-C, a stopped job),
        left running for the caller to start again (a lost worker with recoveries left), or failed."""
        writer = self.writer
        status, done = "failed", len(self.history) and self.history[-1].round
        if self.loggers is not None:  # a run started again after a lost worker goes on in them
            lost = isinstance(e, (GeneratorExit, KeyboardInterrupt, WorkerLost))
            self.loggers.end("interrupted" if lost else "failed")
        if isinstance(e, (GeneratorExit, KeyboardInterrupt)):
            status, error = "interrupted", f"interrupted after {done} of {self.cfg.rounds} rounds"
            writer.event("interrupted", done)
        elif isinstance(e, WorkerLost) and failures_left > 0:
            writer.event("worker_lost", done, str(e))
            writer.write_progress(self.summary())
            writer.release()
            return
        else:
            error = failure_text(e)
            writer.event("failed", done, f"{type(e).__name__}: {e}")
        try:
            writer.fail(error, self.summary(), status)
        except OSError as unwritten:  # a full disk: the run's own error goes on, saying so (a note)
            note = f"(its {status} row could not be written in {self.cfg.output}/runs/: {unwritten})"
            e.__notes__ = [*getattr(e, "__notes__", []), note]


def execute(
    cfg: Config,
    make_federation: FederationFactory,
    restart: bool = False,
    reason: str = "",
    failures_left: int = 0,
    stop_at: int | None = None,
    stopped_by: str = "",
) -> Iterator[Event]:
    """Run one experiment end to end; the results writer records success or the failure.

    An unfinished run with a checkpoint goes on from it (``restart``: from the start; ``reason`` is
    noted with the resume). A lost worker (`WorkerLost`) with ``failures_left`` > 0 leaves the run
    ``running`` for the caller to start again on new workers; otherwise it fails the run.
    ``stop_at`` (below the config's rounds): the run stops after that round, recorded ``stopped``
    (``stopped_by`` says who asked) with a checkpoint there (`Stopped`), and a later call goes on
    from it; a run already past it stops where its checkpoint is.
    """
    if cfg.gpus_auto:  # its run id and numbers depend on where it runs: resolved before it gets here
        raise ValueError(
            "num_gpus_per_actor is auto: resolve it where the run goes first (fedray.api.resolve_gpus)"
        )
    run_id = cfg.run_id()
    run = _Run(
        cfg,
        ResultsWriter(cfg.output, run_id, cfg.recorded()),
        Checkpoints(cfg.output, run_id, cfg.keep_checkpoints),
    )
    run.writer.acquire()  # before reading or removing anything of an earlier attempt
    if not restart and run.writer.earlier_status == "finished":
        # Finished since whoever called this looked (another sweep over the same runs finished it
        # meanwhile): nothing to run, and nothing of it is touched; on other data, refused.
        run.writer.release()
        if said := changes(run.writer.data, identity(cfg.data_section)):
            raise DataChanged(finished_refusal(run_id, cfg.output, said))
        yield Finished(run_id, run.writer.earlier_summary, already=True)
        return
    try:
        alg, hp, state, start = run.start(make_federation, restart, reason)
        yield Started(run_id, len(run.fed.client_ids), run.placement, start, run.timings)
        if stop_at is not None and stop_at < cfg.rounds:
            yield from run.rounds(state, start, stop_at)
            end: Stopped | Finished = run.stop(stopped_by)
        else:
            state = yield from run.rounds(state, start)
            end = Finished(run_id, run.finish(alg, hp, state))
    except BaseException as e:
        run.ended(e, failures_left)
        raise
    finally:
        if run.fed is not None:
            run.fed.close()
    # recorded, its workers released: a consumer that stops here (closes the generator) changes nothing
    yield end


def restore(ckpts: Checkpoints, ckpt: Checkpoint, fed: HostedFederation) -> Any:
    """The State saved in ``ckpt`` (one of ``ckpts``), with every client's state given back to
    ``fed``'s clients; each file checked to be this run's, and its client's."""
    state = ckpts.load_state(ckpt, fed.restore_baton)
    known = set(fed.client_ids) | set(fed.test_client_ids)
    states = ckpts.client_states(ckpt)

    def checked() -> Iterator[tuple[int, Any]]:
        for cid, cstate in states:
            if cid not in known:
                raise CheckpointError(
                    f"{ckpt.path}: holds the state of client {cid}, which this run does not have"
                )
            yield cid, cstate

    fed.restore_client_states(checked())
    return state
