"""One rule for choosing, shared by a search among its trials and `fedray report --tuned` among a
cell's settings (fedray/sweeps/choosing.py): where a curve is read, and how candidates rank, worked
out by hand."""

from __future__ import annotations

import math

import pytest

from analysis.report import tuned_choice
from fedray.sweeps.choosing import At, parse_at, ranked, read_at
from fedray.sweeps.search import Trial, rank
from fedray.sweeps.tuning import TuneError, read_spec

NAN = math.nan
CURVE = [(2, 0.60), (3, 0.70), (4, 0.65), (5, 0.66)]


def test_a_curve_is_read_at_its_final_best_best_train_or_last_k_evaluations():
    assert read_at(CURVE, At("final")) == (5.0, 0.66)
    assert read_at(CURVE, At("best")) == (3.0, 0.70)
    assert read_at(CURVE, At("best"), better="lower") == (2.0, 0.60)  # a loss: its lowest
    assert read_at([(1, 0.5), (2, 0.7), (3, 0.7)], At("best")) == (2.0, 0.7)  # the first on a tie
    # training accuracy best (0.95) at rounds 2 and 4 among the curve's rounds; round 1 has no value
    train = [(1, 0.99), (2, 0.95), (3, 0.90), (4, 0.95), (5, 0.80)]
    assert read_at(CURVE, At("best-train"), train=train) == (2.0, 0.60)
    assert read_at(CURVE, At("mean_last", 2)) == (5.0, pytest.approx(0.655))
    assert read_at(CURVE, At("mean_last", 9))[1] == pytest.approx((0.60 + 0.70 + 0.65 + 0.66) / 4)
    assert all(math.isnan(x) for x in read_at([], At("final")))
    assert all(math.isnan(x) for x in read_at(CURVE, At("best-train"), train=[]))


def test_where_to_read_is_written_one_way_in_a_file_and_on_a_command_line():
    assert parse_at("final") == At("final") and parse_at("best-train") == At("best-train")
    assert (
        parse_at({"mean_last": 3})
        == parse_at("mean_last:3")
        == parse_at("mean_last: 3")
        == At("mean_last", 3)
    )
    assert At("mean_last", 3).text == "mean_last 3"
    for bad in ("last", {"mean_last": 0}, "mean_last:x", {"mean_last": True}):
        with pytest.raises(ValueError, match="final, best, best-train or mean_last: K"):
            parse_at(bad)
    with pytest.raises(TuneError, match="best-train reads training accuracy, which a search does not record"):
        read_spec({"search": {"lr": {"loguniform": [0.01, 0.1]}}, "at": "best-train"}, ["fedavg"])


def test_candidates_rank_by_seeds_then_diverged_runs_then_mean_then_the_order_they_came_in():
    cands = [
        ([0.90], 0),  # 0: one seed only: cannot win over settings run in full
        ([0.80, 0.82], 0),  # 1: mean 0.81
        ([0.84, NAN], 1),  # 2: one value and a diverged run: full, but a run diverged
        ([0.83, 0.79], 0),  # 3: mean 0.81, as 1: after it, listed later
        ([NAN, NAN], 0),  # 4: no value: last
        ([0.70, 0.72], 0),  # 5
    ]
    assert ranked(cands) == [1, 3, 5, 2, 0, 4]
    assert ranked(cands, "lower")[:3] == [5, 1, 3]  # a loss: the lowest mean first
    names = [f"s{i}" for i in range(len(cands))]
    assert tuned_choice(dict(zip(names, cands, strict=True))) == "s1"
    assert tuned_choice({"a": ([NAN], 0), "b": ([], 2)}) == "a"  # nothing valued: the first


def test_a_searchs_trials_rank_by_the_same_rule_in_draw_order_on_a_tie():
    class Spec:
        mode = "max"

    trials = [Trial(index=i, values={}, configs=[], value=v) for i, v in enumerate([0.7, NAN, 0.9, 0.9, 0.8])]
    trials[1].diverged = True
    shuffled = [trials[3], trials[1], trials[4], trials[0], trials[2]]
    assert [t.index for t in rank(shuffled, Spec())] == [2, 3, 4, 0, 1]
    Spec.mode = "min"
    assert [t.index for t in rank(shuffled, Spec())] == [0, 4, 2, 3, 1]


def test_a_value_that_is_not_a_number_is_no_best_and_the_report_says_how_it_read():
    from analysis.fidelity import _reading
    from analysis.report import describe_value

    assert read_at([(1, NAN), (2, 0.5), (3, 0.4)], At("best")) == (2.0, 0.5)
    assert all(math.isnan(x) for x in read_at([(1, NAN)], At("best")))
    assert "accuracy (%) at the mean of its last 3 evaluations" in describe_value(
        "accuracy", "mean_last:3", None, None
    )
    assert _reading({"at": {"mean_last": 3}}) == "accuracy at the mean of the last 3 evaluations"
