"""A search's decisions (fedray.sweeps.search), worked out by hand and driven without Ray: the
schedule of successive halving, the draws, the tie rule, a setting drawn twice, a diverged trial,
and that the decisions depend on the recorded values alone (whatever order the runs ran in, and
again from the records after an interruption)."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from fedray.sweeps import search as search_mod
from fedray.sweeps.search import CellSearch, Record, draw, rank, value_at
from fedray.sweeps.tuning import (
    TuneError,
    check_schedule,
    read_spec,
    rungs,
    schedule_rounds,
)
from tests.conftest import small_config


def spec_of(block: dict, algorithms=("fedavg",)):
    return read_spec(block, algorithms)


LR = {"lr": {"loguniform": [0.001, 1.0]}}


@pytest.mark.parametrize(
    "n, grace, factor, rounds, want",
    [
        # 16 trials, grace 3, eta 3, 30 rounds: after round 3 the best 5 go on; 5 // 3 = 1 < 3 would go
        # on after round 9, so the 5 run the budget. 16*3 + 5*27 = 183 trial-rounds of 480.
        (16, 3, 3, 30, [(3, 16), (30, 5)]),
        # 27 trials, grace 1: 27 at 1, 9 at 3, then 9 // 3 = 3 >= 3 stays, 3 // 3 = 1 < 3 stops:
        # 27*1 + 9*2 + 3*27 = 126 trial-rounds.
        (27, 1, 3, 30, [(1, 27), (3, 9), (30, 3)]),
        # eta 2: 16 at 2, 8 at 4, 4 at 8, then 2 of them (>= 2) to the budget of 20
        (16, 2, 2, 20, [(2, 16), (4, 8), (8, 4), (20, 2)]),
        # too few to halve: every trial runs the budget
        (8, 1, 3, 10, [(10, 8)]),
        # a rung at or past the budget is never made
        (81, 4, 3, 10, [(4, 81), (10, 27)]),
    ],
)
def test_the_schedule_of_successive_halving_by_hand(n, grace, factor, rounds, want):
    spec = spec_of(
        {
            "search": LR,
            "scheduler": {"successive_halving": {"grace_rounds": grace, "reduction_factor": factor}},
        }
    )
    assert rungs(spec, n, rounds) == want


def test_trial_rounds_of_a_schedule_by_hand():
    assert schedule_rounds([(3, 16), (30, 5)]) == 16 * 3 + 5 * 27 == 183
    assert schedule_rounds([(1, 27), (3, 9), (30, 3)], seeds=2) == 2 * (27 + 9 * 2 + 3 * 27) == 252
    assert schedule_rounds([(10, 8)]) == 80


def test_asha_as_files_write_it_is_successive_halving():
    a = spec_of({"search": LR, "scheduler": {"asha": {"grace_rounds": 3}}})
    b = spec_of({"search": LR, "scheduler": {"successive_halving": {"grace_rounds": 3}}})
    assert a == b and a.scheduler == "successive_halving"


@pytest.mark.parametrize(
    "block, over, message",
    [
        (
            {"search": LR, "scheduler": {"asha": {"grace_rounds": 50}}},
            {"rounds": 3},
            r"^tune\.scheduler\.successive_halving\.grace_rounds: 50 is not below rounds \(3\)",
        ),
        (
            {"search": LR, "scheduler": {"asha": {"grace_rounds": 2}}},
            {"rounds": 20, "eval_every": 5},
            r"^tune\.scheduler\.successive_halving\.grace_rounds: 2 comes before the first evaluation \(eval_every 5\)",
        ),
        (
            {"search": LR, "trials": 4, "scheduler": {"asha": {"grace_rounds": 1}}},
            {"rounds": 10},
            r"^tune\.scheduler: 4 trials are too few to halve at reduction_factor 3 .* it needs 9 trials or more",
        ),
    ],
)
def test_a_written_scheduler_that_cannot_stop_a_trial_is_refused(tmp_path, block, over, message):
    with pytest.raises(TuneError, match=message):
        check_schedule(small_config(tmp_path, **over), spec_of(block))


def test_the_default_scheduler_halves_only_where_it_can():
    spec = spec_of({"search": LR, "trials": 4})
    assert not spec.scheduler_written
    assert rungs(spec, 4, 10) == [(10, 4)]  # nothing refused: every trial runs the budget


def test_trials_on_a_grid_are_refused_and_a_grid_runs_each_value_once():
    grid = {"hp.mu": {"grid": [0.001, 0.01, 0.1]}}
    with pytest.raises(
        TuneError, match=r"^tune\.trials: every searched key is a grid.*trials: 2 would run each again"
    ):
        spec_of({"search": grid, "search_alg": "grid", "trials": 2}, ["fedprox"])
    spec = spec_of({"search": grid, "search_alg": "grid"}, ["fedprox"]).for_algorithm("fedprox")
    assert spec.trials == 1 and [v["hp.mu"] for v in draw(spec)] == [0.001, 0.01, 0.1]


def test_the_draws_are_the_seeds_and_a_grid_goes_with_every_draw():
    spec = spec_of({"search": {**LR, "momentum": {"grid": [0.0, 0.9]}}, "trials": 3, "seed": 5})
    drawn = draw(spec)
    assert draw(spec) == drawn and len(drawn) == 6
    assert [d["momentum"] for d in drawn] == [0.0, 0.9] * 3
    assert all(0.001 <= d["lr"] <= 1.0 and isinstance(d["lr"], float) for d in drawn)
    assert draw(spec_of({"search": LR, "trials": 3, "seed": 6})) != [d for d in drawn[::2]]


def test_value_at_and_the_tie_rule():
    spec = spec_of({"search": LR, "at": {"mean_last": 2}})
    curve = [(1, 0.5), (2, 0.7), (3, 0.6), (4, 0.9)]
    assert value_at(curve, 3, spec) == pytest.approx(0.65)
    assert value_at(curve, 4, spec_of({"search": LR, "at": "best"})) == 0.9
    assert value_at(curve, 3, spec_of({"search": LR, "at": "best"})) == 0.7
    assert value_at(curve, 3, spec_of({"search": LR})) == 0.6
    assert math.isnan(value_at(curve, 0, spec))
    t = [search_mod.Trial(i, {"lr": i}, [], value=v) for i, v in enumerate([0.5, math.nan, 0.9, 0.9, 0.1])]
    assert [x.index for x in rank(t, spec_of({"search": LR}))] == [2, 3, 0, 4, 1]
    assert [x.index for x in rank(t, spec_of({"search": LR, "metric": "val_loss"}))] == [4, 0, 2, 3, 1]


class FakeRuns:
    """Runs as records, "run" by the test: a run brought to round R records the value of its lr's
    curve (``score(values, round)``) at every round up to R, stopped at R or finished."""

    def __init__(self, score, budget, diverge_at=None):
        self.score, self.budget, self.diverge_at = score, budget, diverge_at or {}
        self.records: dict[str, Record] = {}
        self.ran: list[tuple[str, int]] = []

    def read(self, cfg, metric):
        return self.records.get(cfg.run_id(), Record(None))

    def run(self, works, order):
        for w in order(works):
            lr = w.config.lr
            self.ran.append((w.run_id, w.until))
            stop = self.diverge_at.get(lr)
            if stop is not None and stop <= w.until:
                curve = [(r, self.score(lr, r)) for r in range(1, stop)]
                self.records[w.run_id] = Record("failed", stop - 1, stop, "FloatingPointError: round", curve)
                continue
            status = "finished" if w.until == self.budget else "stopped"
            curve = [(r, self.score(lr, r)) for r in range(1, w.until + 1)]
            self.records[w.run_id] = Record(status, w.until, None, "", curve)


def drive(search, runs, order=lambda ws: ws):
    steps = search.steps()
    try:
        works = next(steps)
        while True:
            runs.run(works, order)
            works = steps.send(None)
    except StopIteration as stop:
        return stop.value


def bell(lr, rnd):
    """A curve that rises with the round, best near lr 0.1, rounded so that trials tie."""
    return round(min(rnd, 10) / 10 * math.exp(-abs(math.log10(lr) + 1)), 2)


def _search(tmp_path, monkeypatch, runs, block, **over):
    cfg = small_config(tmp_path, rounds=12, validation_fraction=0.2, **over)
    monkeypatch.setattr(search_mod, "read_record", runs.read)
    return CellSearch(cfg, spec_of(block))


BLOCK = {
    "search": LR,
    "trials": 16,
    "scheduler": {"asha": {"grace_rounds": 2, "reduction_factor": 3}},
    "seed": 1,
}


def test_the_decisions_are_the_values_whatever_order_the_runs_ran_in(tmp_path, monkeypatch):
    outcomes = []
    for order in (lambda ws: ws, lambda ws: ws[::-1], lambda ws: random.Random(3).sample(ws, len(ws))):
        runs = FakeRuns(bell, 12)
        out = drive(_search(tmp_path, monkeypatch, runs, BLOCK), runs, order)
        outcomes.append(out)
        assert out.schedule == [(2, 16), (12, 5)]
        assert sorted(u for _, u in runs.ran) == [2] * 16 + [12] * 5  # each run once a rung
        assert out.trial_rounds == 16 * 2 + 5 * 10
    chosen = [(o.chosen.index, o.chosen.values) for o in outcomes]
    assert chosen[0] == chosen[1] == chosen[2]
    stopped = [[t.stopped for t in o.trials] for o in outcomes]
    assert stopped[0] == stopped[1] == stopped[2] and sum(stopped[0]) == 11


def test_ties_go_to_the_trial_drawn_first_at_every_rung_and_in_the_choice(tmp_path, monkeypatch):
    runs = FakeRuns(lambda lr, r: 0.5, 12)  # every trial ties everywhere
    out = drive(_search(tmp_path, monkeypatch, runs, BLOCK), runs)
    assert [t.index for t in out.trials if not t.stopped] == [0, 1, 2, 3, 4]
    assert out.chosen.index == 0


def test_a_finished_search_replays_from_its_records_and_runs_nothing(tmp_path, monkeypatch):
    runs = FakeRuns(bell, 12)
    first = drive(_search(tmp_path, monkeypatch, runs, BLOCK), runs)
    ran = len(runs.ran)
    again = drive(_search(tmp_path, monkeypatch, runs, BLOCK), runs)
    assert len(runs.ran) == ran  # nothing run again
    assert again.chosen.values == first.chosen.values and again.trial_rounds == first.trial_rounds


def test_an_interrupted_search_goes_on_from_its_records_to_the_same_choice(tmp_path, monkeypatch):
    whole = FakeRuns(bell, 12)
    want = drive(_search(tmp_path, monkeypatch, whole, BLOCK), whole)
    runs = FakeRuns(bell, 12)
    steps = _search(tmp_path, monkeypatch, runs, BLOCK).steps()
    works = next(steps)
    runs.run(works[:7], lambda ws: ws)  # 7 of the first rung's 16 ran, then the search was stopped
    steps.close()
    got = drive(_search(tmp_path, monkeypatch, runs, BLOCK), runs)
    assert got.chosen.values == want.chosen.values
    assert len(runs.ran) == len(whole.ran)  # each rung's run once, over both attempts


def test_a_setting_drawn_again_is_one_trial_and_counts_once(tmp_path, monkeypatch):
    runs = FakeRuns(bell, 12)
    block = {"search": {"lr": {"choice": [0.01, 0.1, 0.3]}}, "trials": 7, "scheduler": "none", "seed": 0}
    out = drive(_search(tmp_path, monkeypatch, runs, block), runs)
    assert sorted(t.values["lr"] for t in out.trials) == [0.01, 0.1, 0.3]
    assert sum(t.draws for t in out.trials) == 7 and all(not math.isnan(t.value) for t in out.trials)
    assert len(runs.ran) == 3 and out.chosen.values == {"lr": 0.1}


def test_a_diverged_trial_ranks_last_and_the_search_goes_on(tmp_path, monkeypatch):
    block = {
        "search": {"lr": {"choice": [0.1, 0.05, 0.02]}},
        "trials": 3,
        "search_alg": "random",
        "scheduler": "none",
    }
    runs = FakeRuns(lambda lr, r: 0.9 if lr == 0.1 else 0.5, 12, diverge_at={0.1: 5})
    search = _search(tmp_path, monkeypatch, runs, {**block, "seed": 2})
    out = drive(search, runs)
    diverged = [t for t in out.trials if t.diverged]
    assert [t.values["lr"] for t in diverged] == [0.1] and out.chosen.values["lr"] != 0.1


def test_every_finalist_diverged_is_said(tmp_path, monkeypatch):
    block = {"search": {"lr": {"choice": [0.1]}}, "trials": 1, "scheduler": "none"}
    runs = FakeRuns(bell, 12, diverge_at={0.1: 3})
    with pytest.raises(
        TuneError, match=r"every trial that ran the whole budget ended without a val_accuracy"
    ):
        drive(_search(tmp_path, monkeypatch, runs, block), runs)


def test_optuna_asks_in_batches_told_in_order_so_its_draws_are_the_file(tmp_path, monkeypatch):
    pytest.importorskip("optuna")
    block = {"search": LR, "trials": 9, "search_alg": "optuna", "batch": 3, "scheduler": "none", "seed": 4}
    draws = []
    for order in (lambda ws: ws, lambda ws: ws[::-1]):
        runs = FakeRuns(bell, 12)
        out = drive(_search(tmp_path, monkeypatch, runs, block), runs, order)
        draws.append([t.values["lr"] for t in out.trials])
        assert sorted(u for _, u in runs.ran) == [12] * len(out.trials)
    assert draws[0] == draws[1] and len(draws[0]) == 9


def test_a_failed_run_is_named_with_its_trial_and_error(tmp_path, monkeypatch):
    runs = FakeRuns(bell, 12)
    block = {"search": {"lr": {"choice": [0.1]}}, "trials": 1, "scheduler": "none"}
    search = _search(tmp_path, monkeypatch, runs, block)
    steps = search.steps()
    works = next(steps)
    runs.records[works[0].run_id] = Record("failed", 1, None, "ClientError: client 3: boom\ntraceback ...")
    with pytest.raises(TuneError, match=r"trial lr=0\.1 \(run .*\) failed: ClientError: client 3: boom$"):
        steps.send(None)


def test_per_algorithm_keys_are_searched_in_that_algorithms_cells_only():
    block = {
        "search": {"lr": {"loguniform": [0.01, 0.5]}},
        "per_algorithm": {
            "fedprox": {"hp.mu": {"grid": [0.001, 0.01]}},
            "moon": {"hp.mu": {"choice": [0.1, 1.0]}},
        },
        "trials": 3,
    }
    spec = spec_of(block, ["fedavg", "fedprox", "moon"])
    assert list(spec.for_algorithm("fedavg").search) == ["lr"]
    assert (
        list(spec.for_algorithm("fedprox").search) == ["lr", "hp.mu"]
        and spec.for_algorithm("fedprox").total == 6
    )
    assert spec.for_algorithm("moon").search["hp.mu"].kind == "choice"
    grids = spec_of(
        {"search": {}, "per_algorithm": {"moon": {"hp.mu": {"grid": [0.1, 1.0, 5.0]}}}}, ["fedavg", "moon"]
    )
    assert grids.for_algorithm("moon").trials == 1 and not grids.for_algorithm("fedavg").search


@pytest.mark.parametrize(
    "per, message",
    [
        (
            {"fedcat": {"lr": {"uniform": [0.1, 0.2]}}},
            r"^tune\.per_algorithm\.fedcat: no cell of the file runs fedcat",
        ),
        (
            {"fedavg": {"hp.mu": {"grid": [0.1]}}},
            r"^tune\.per_algorithm\.fedavg\.hp\.mu: hp\.mu is not a hyperparameter of fedavg",
        ),
        ({"fedprox": {}}, r"^tune\.per_algorithm\.fedprox: fedprox's keys to search"),
    ],
)
def test_a_bad_per_algorithm_search_is_named(per, message):
    with pytest.raises(TuneError, match=message):
        spec_of({"search": {}, "per_algorithm": per}, ["fedavg", "fedprox"])


def test_rungs_fall_on_evaluated_rounds():
    spec = spec_of({"search": LR})  # the default: grace 1, factor 3
    assert rungs(spec, 27, 40, eval_every=5) == [(5, 27), (10, 9), (40, 3)]
    assert rungs(spec, 27, 40, eval_every=1) == [(1, 27), (3, 9), (40, 3)]


def test_restart_starts_each_run_over_once_then_goes_on_from_its_rung(tmp_path, monkeypatch):
    """--restart: what the runs held before is not read, each is started over the first time the
    search asks for it, and goes on from its rung's checkpoint when it is asked further."""
    runs = FakeRuns(bell, 12)
    drive(_search(tmp_path, monkeypatch, runs, BLOCK), runs)
    before = dict(runs.records)
    worse = FakeRuns(lambda lr, r: -bell(lr, r), 12)  # what the runs would record now
    worse.records = dict(before)
    search = _search(tmp_path, monkeypatch, worse, BLOCK)
    search.restart = True
    flags = []
    steps = search.steps()
    try:
        works = next(steps)
        while True:
            flags.append(sorted({(w.until, w.restart) for w in works}))
            worse.run(works, lambda ws: ws)
            works = steps.send(None)
    except StopIteration as stop:
        out = stop.value
    assert flags == [[(2, True)], [(12, False)]]  # every run of the first rung again, from the start
    again = FakeRuns(lambda lr, r: -bell(lr, r), 12)
    want = drive(_search(tmp_path, monkeypatch, again, BLOCK), again)
    assert out.chosen.values == want.chosen.values  # decided on what the runs record now


def test_a_run_already_past_its_rung_is_read_there_not_run_again(tmp_path, monkeypatch):
    runs = FakeRuns(bell, 12)
    search = _search(tmp_path, monkeypatch, runs, BLOCK)
    steps = search.steps()
    first = next(steps)
    runs.run([replace(w, until=12) for w in first[:4]], lambda ws: ws)  # four of them finished before
    steps.close()
    ran = len(runs.ran)
    out = drive(_search(tmp_path, monkeypatch, runs, BLOCK), runs)
    asked = runs.ran[ran:]
    finished_before = {w.run_id for w in first[:4]}
    assert not [r for r, _ in asked if r in finished_before]  # read at their rungs, never run again
    t = next(t for t in out.trials if t.run_ids[0] == first[0].run_id)
    assert t.value == bell(t.values["lr"], t.rounds)  # its value at the round asked, not at 12


def test_every_trial_without_a_value_at_a_rung_is_said(tmp_path, monkeypatch):
    runs = FakeRuns(lambda lr, r: math.nan, 12)
    with pytest.raises(TuneError, match=r"no trial recorded val_accuracy by round 2 \(eval_every 1\)"):
        drive(_search(tmp_path, monkeypatch, runs, BLOCK), runs)
