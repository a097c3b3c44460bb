"""fedray report on a hand-made results folder: the pivot, --round within --stage, --at best-train."""

from __future__ import annotations

import io
import sys

import pandas as pd
import pytest

from analysis import ReportError, format_table, pivot, run_values, wide_tables
from fedray.records import rec
from fedray.storage.writer import ResultsWriter
from tests.conftest import ROOT, small_config
from tests.helpers import final, run, write_run


@pytest.fixture
def results(tmp_path):
    out = tmp_path / "out"
    base = small_config(tmp_path).to_dict()

    def cfg(**over):
        c = {**base, "experiment": "table", **over}
        c["hp"] = dict(over.get("hp", {}))
        return c

    labels, dirichlet = (
        dict(partition="labels", partition_k=2),
        dict(partition="dirichlet", partition_beta=0.5),
    )
    for seed, acc in enumerate([0.80, 0.82, 0.84]):
        write_run(out, cfg(seed=seed, **labels), final(acc))
    for seed, acc in enumerate([0.85, 0.87]):
        write_run(out, cfg(seed=seed, **dirichlet), final(acc))
    write_run(out, cfg(seed=2, **dirichlet), final(0.10), status="failed")
    # an hp grid: two settings that the rows and columns do not tell apart
    write_run(out, cfg(algorithm="fedprox", hp={"mu": 0.001}, **labels), final(0.83))
    write_run(out, cfg(algorithm="fedprox", hp={"mu": 0.01}, **labels), final(0.79))
    write_run(out, cfg(algorithm="fedprox", hp={"mu": 0.01}, seed=1, **labels), final(0.81))

    # A two-stage run: rounds 1-3 "encoder", rounds 4-8 "classifier" (accuracy = round / 10).
    staged = {
        r: [rec("seconds", 1.0, stage="encoder"), rec("train_accuracy", 0.5, stage="encoder")]
        for r in (1, 2, 3)
    }
    staged |= {
        r: [
            rec("seconds", 1.0, stage="classifier"),
            rec("accuracy", r / 10, stage="classifier"),
            rec("train_accuracy", 0.9, stage="classifier"),
        ]
        for r in range(4, 9)
    }
    write_run(out, cfg(experiment="staged", algorithm="fedconcat", **labels), staged)

    # best-train: train accuracy peaks first at round 2; accuracy is only evaluated at rounds 2, 3, 4, 5.
    acc = {2: 0.60, 3: 0.70, 4: 0.65, 5: 0.66}
    train = {1: 0.99, 2: 0.95, 3: 0.90, 4: 0.95, 5: 0.80}  # round 1 has no accuracy: not eligible
    rounds = {
        r: [rec("train_accuracy", train[r])] + ([rec("accuracy", acc[r])] if r in acc else []) for r in train
    }
    write_run(out, cfg(experiment="protocol", algorithm="fedrc", **labels), rounds)
    return out


def table(out, **kw):
    values = run_values(out, **{k: v for k, v in kw.items() if k not in ("rows", "cols")})
    rows = kw.get("rows", ("dataset", "partition"))
    return wide_tables(
        pivot(values, rows, kw.get("cols", ("algorithm",))), rows, kw.get("metric", "accuracy")
    )


def test_pivot_rows_settings_columns_algorithms_cells_mean_std_over_seeds(results):
    t = table(results)["table"]
    assert list(t.columns) == ["dataset", "partition", "fedavg", "fedprox hp.mu=0.001", "fedprox hp.mu=0.01"]
    cells = t.set_index("partition")
    # (80 + 82 + 84) / 3 = 82, std (ddof 1) = 2; (85 + 87) / 2 = 86, std = sqrt(2) = 1.41; the failed run is out
    assert cells.loc["#C=2", "fedavg"] == "82.0 ± 2.0 (3)"
    assert cells.loc["dirichlet(0.5)", "fedavg"] == "86.0 ± 1.4 (2)"
    assert cells.loc["#C=2", "fedprox hp.mu=0.001"] == "83.0 (1)"
    assert cells.loc["#C=2", "fedprox hp.mu=0.01"] == "80.0 ± 1.4 (2)"
    assert cells.loc["dirichlet(0.5)", "fedprox hp.mu=0.01"] == "-"
    with_failed = table(results, include_unfinished=True)["table"].set_index("partition")
    # mean (85 + 87 + 10) / 3, std sqrt(3852.7 / 2)
    assert with_failed.loc["dirichlet(0.5)", "fedavg"] == "60.7 ± 43.9 (3)"


def test_tuned_shows_each_cells_best_hp_setting_and_names_it(results):
    values = run_values(results)
    cells = pivot(values, tuned=True)
    t = wide_tables(cells, ("dataset", "partition"), "accuracy")["table"].set_index("partition")
    assert list(t.columns) == ["dataset", "fedavg", "fedprox"]  # the settings share one column
    # mu=0.01, (79 + 81) / 2 = 80 over two seeds, beats mu=0.001's 83 from one seed (only the settings
    # run with the most seeds compete); the cell keeps the winner's seeds
    assert t.loc["#C=2", "fedprox"] == "80.0 ± 1.4 (2)" and t.loc["#C=2", "fedavg"] == "82.0 ± 2.0 (3)"
    chosen = cells[cells["setting"] != ""][["experiment", "partition", "col", "setting"]].values.tolist()
    assert chosen == [["table", "#C=2", "fedprox", "hp.mu=0.01"]]
    p = run([sys.executable, "-m", "jobs.cli", "report", str(results), "--tuned", "--no-plots"], cwd=ROOT)
    assert p.returncode == 0, p.stderr
    assert "tuned: each cell is its column's best hp (and lr) setting" in p.stdout
    assert "\n  table: synthetic #C=2 fedprox: hp.mu=0.01\n" in p.stdout


def test_a_setting_left_at_its_default_is_named_by_its_value(tmp_path):
    # FedLC's tau=1.0 is its default: the run's config names no tau, its summary has every hp value
    out = tmp_path / "out"
    base = {**small_config(tmp_path).to_dict(), "experiment": "t", "algorithm": "fedlc"}
    write_run(out, {**base, "hp": {}}, final(0.70), summary={"hparams": {"tau": 1.0}})
    write_run(out, {**base, "hp": {"tau": 0.1}}, final(0.60), summary={"hparams": {"tau": 0.1}})
    plain = wide_tables(pivot(run_values(out)), ("dataset", "partition"), "accuracy")["t"]
    assert list(plain.columns)[2:] == ["fedlc hp.tau=1", "fedlc hp.tau=0.1"]
    cells = pivot(run_values(out), tuned=True)
    assert cells[["col", "setting", "mean"]].values.tolist() == [["fedlc", "hp.tau=1", 0.70]]


def test_a_key_that_splits_one_algorithms_runs_labels_that_algorithm_only(tmp_path):
    # FedRS ran with and without the head's bias, FedAvg only with: FedAvg's column keeps its name
    # (the seeds only give the runs distinct ids here)
    out = tmp_path / "out"
    base = {**small_config(tmp_path).to_dict(), "experiment": "t"}
    write_run(out, {**base, "algorithm": "fedavg"}, final(0.70))
    write_run(out, {**base, "algorithm": "fedrs", "head_bias": False, "seed": 0}, final(0.60))
    write_run(out, {**base, "algorithm": "fedrs", "head_bias": True, "seed": 1}, final(0.65))
    cells = pivot(run_values(out))
    assert cells[["col", "mean"]].values.tolist() == [
        ["fedavg", 0.70],
        ["fedrs head_bias=false", 0.60],
        ["fedrs head_bias=true", 0.65],
    ]


def test_a_run_recorded_before_a_key_existed_groups_with_later_runs_of_its_setting(tmp_path):
    # seed 0 was recorded before cuda_deterministic existed (its config lacks the key); seed 1 has
    # the key at the value that means "as before": one cell of two seeds, no extra label
    out = tmp_path / "out"
    base = {**small_config(tmp_path).to_dict(), "experiment": "t"}
    old = {k: v for k, v in base.items() if k != "cuda_deterministic"}
    write_run(out, {**old, "seed": 0}, final(0.70))
    write_run(out, {**base, "seed": 1, "cuda_deterministic": True}, final(0.80))
    cells = pivot(run_values(out))
    assert cells[["col", "n"]].values.tolist() == [["fedavg", 2]]
    assert cells["mean"].iloc[0] == pytest.approx(0.75)


def test_seeds_run_on_other_placements_share_one_cell(tmp_path):
    # a sweep's seeds run on different GPU shares and CPU counts (a second device session with more
    # runs side by side): one cell of two seeds, not a column per placement
    out = tmp_path / "out"
    base = {**small_config(tmp_path).to_dict(), "experiment": "t"}
    write_run(out, {**base, "seed": 0, "num_gpus_per_actor": 0.5, "num_cpus_per_actor": 4}, final(0.70))
    write_run(out, {**base, "seed": 1, "num_gpus_per_actor": 0.25, "num_cpus_per_actor": 3}, final(0.80))
    cells = pivot(run_values(out))
    assert cells[["col", "n"]].values.tolist() == [["fedavg", 2]]


def test_seeds_run_packed_and_alone_share_one_cell(tmp_path):
    # a sweep's seeds packed (`pack_runs`: each run's numbers are its own alone, up to float round-off)
    # and a seed run alone afterwards: one cell of three seeds, not a column `fedavg pack_runs=on`
    out = tmp_path / "out"
    base = {**small_config(tmp_path).to_dict(), "experiment": "t", "batched_clients": "on"}
    write_run(out, {**base, "seed": 0, "pack_runs": "on"}, final(0.70))
    write_run(out, {**base, "seed": 1, "pack_runs": "on"}, final(0.80))
    write_run(out, {**base, "seed": 2, "pack_runs": "off"}, final(0.90))
    cells = pivot(run_values(out))
    assert cells[["col", "n"]].values.tolist() == [["fedavg", 3]]
    assert cells["mean"].iloc[0] == pytest.approx(0.80)


def test_rows_by_one_hp_key_read_a_default_as_its_value(tmp_path):
    # FedAvg's stragglers at 0.5, and at their default 0 (left out of the config); SCAFFOLD has no
    # such key: its row reads "-"
    out = tmp_path / "out"
    base = {**small_config(tmp_path).to_dict(), "experiment": "t"}
    write_run(out, {**base, "hp": {"stragglers": 0.5}}, final(0.60))
    write_run(out, {**base, "hp": {}}, final(0.70))
    write_run(out, {**base, "algorithm": "scaffold", "hp": {}}, final(0.65))
    cells = pivot(run_values(out), rows=("hp.stragglers",))
    got = {(r, c): m for r, c, m in cells[["hp.stragglers", "col", "mean"]].itertuples(index=False)}
    assert got == {("0.5", "fedavg"): 0.60, ("0", "fedavg"): 0.70, ("-", "scaffold"): 0.65}


def test_rows_and_columns_are_chosen_by_flags(results):
    t = table(results, rows=("algorithm",), cols=("partition", "hp"))["table"]
    # a run at its algorithm's default hp is labelled by the other fields alone
    assert list(t.columns) == ["algorithm", "#C=2", "dirichlet(0.5)", "#C=2 mu=0.001", "#C=2 mu=0.01"]
    assert t.set_index("algorithm").loc["fedavg", "dirichlet(0.5)"] == "86.0 ± 1.4 (2)"
    only_hp = table(results, rows=("partition",), cols=("hp",))["table"]
    assert list(only_hp.columns) == ["partition", "-", "mu=0.001", "mu=0.01"]  # hp alone: "-" says default
    loss = table(results, metric="train_accuracy")["table"].set_index("partition")
    assert loss.loc["#C=2", "fedavg"] == "50.0 ± 0.0 (3)"
    with pytest.raises(
        ReportError,
        match=r"unknown field 'partitoin' for --rows/--cols; did you mean 'partition'\? \(fields: partition, hp, "
        r"and the config keys: .*batch_size",
    ):
        table(results, rows=("partitoin",))


def test_round_is_counted_within_a_stage(results):
    def staged(**kw):
        return table(results, **kw)["staged"].set_index("partition").loc["#C=2", "fedconcat"]

    assert staged() == "80.0 (1)"  # final round 8
    assert staged(stage="classifier", round=2) == "50.0 (1)"  # the 2nd classifier round is round 5
    assert staged(round=5) == "50.0 (1)"  # absolute round 5
    assert staged(stage="classifier", round=6) == "-"  # the stage has 5 rounds
    assert staged(stage="classifier") == "80.0 (1)"
    values = run_values(results, stage="classifier", round=1)
    assert values.set_index("round").loc[4.0, "value"] == pytest.approx(0.4)
    # runs without the stage (FedAvg next to FedConcat) are read at their final round
    plain = values[~values["in_stage"]]
    assert len(plain) == 9 and set(plain["round"]) == {2.0, 5.0}
    assert (
        table(results, stage="classifier", round=2)["table"].set_index("partition").loc["#C=2", "fedavg"]
        == "82.0 ± 2.0 (3)"
    )
    with pytest.raises(
        ReportError,
        match=r"stage 'clasifier' was not recorded; did you mean 'classifier'\? \(stages: classifier, encoder\)$",
    ):
        run_values(results, stage="clasifier")
    # a round no run got to is refused, naming the furthest (within the stage where one is given)
    with pytest.raises(ReportError, match=r"^--round 99: no run got that far \(the furthest: round 8\)$"):
        run_values(results, round=99)
    far = run_values(results, stage="classifier", round=99)  # FedAvg's runs still answer, at their end
    assert far[far["in_stage"]]["value"].isna().all() and far[~far["in_stage"]]["value"].notna().all()


def test_a_folder_with_no_finished_run_reads_empty_whatever_the_stage(tmp_path):
    """A batch that has not finished a run yet (docs/fidelity.md's sections while they run) is
    empty, not a 'stage was not recorded' error."""
    c = {**small_config(tmp_path).to_dict(), "experiment": "t", "hp": {}}
    write_run(tmp_path / "out", c, final(0.5), status="failed")
    assert run_values(tmp_path / "out", stage="classifier", round=2).empty


def test_a_stage_only_a_running_run_has_reached_reads_the_finished_runs_at_their_final_round(tmp_path):
    """FedAvg finished, FedConcat still running (the paper-budget batch part-way): FedAvg is read
    at its final round, not refused with 'stage was not recorded'."""
    out = tmp_path / "out"
    c = {**small_config(tmp_path).to_dict(), "experiment": "t", "hp": {}}
    write_run(out, c, {1: [rec("accuracy", 0.4)], 2: [rec("accuracy", 0.5)]})
    write_run(
        out,
        {**c, "algorithm": "fedconcat"},
        {1: [rec("accuracy", 0.3, stage="classifier")]},
        status="running",
    )
    values = run_values(out, stage="classifier", round=173)
    assert values[["round", "value"]].values.tolist() == [[2.0, 0.5]]
    with pytest.raises(ReportError, match="stage 'clasifier' was not recorded"):
        run_values(out, stage="clasifier", round=173)


def test_at_best_train_reads_the_round_of_best_training_accuracy(results):
    def protocol(at):
        return table(results, at=at)["protocol"].set_index("partition").loc["#C=2", "fedrc"]

    assert protocol("final") == "66.0 (1)"
    assert protocol("best") == "70.0 (1)"
    # train accuracy is best (0.95) at rounds 2 and 4 among rounds with an accuracy: the first wins
    assert protocol("best-train") == "60.0 (1)"
    # the mean of the last two evaluations, (65 + 66) / 2, as a search's at: {mean_last: 2} reads
    assert protocol("mean_last:2") == "65.5 (1)"
    with pytest.raises(
        ReportError, match=r"--at: final, best, best-train or mean_last: K \(K >= 1 evaluations\), got 'last'"
    ):
        run_values(results, at="last")
    with pytest.raises(
        ReportError,
        match=r"metric 'acuracy' was not recorded; did you mean 'accuracy'\? \(global metrics: accuracy, seconds",
    ):
        run_values(results, metric="acuracy")


def test_formats(results):
    t = table(results)["table"]
    md = format_table(t, "markdown")
    assert md.splitlines()[0].startswith("| dataset") and "| 82.0 ± 2.0 (3) " in md
    tex = format_table(t, "latex")
    assert r"\begin{tabular}" in tex and r"\#C=2" in tex and r"fedprox hp.mu=0.001" in tex
    csv = format_table(t, "csv")
    assert csv.splitlines()[0] == "dataset,partition,fedavg,fedprox hp.mu=0.001,fedprox hp.mu=0.01"
    with pytest.raises(ReportError, match="--format must be one of"):
        format_table(t, "html")


def test_fedray_report_command(results):
    p = run(
        [sys.executable, "-m", "jobs.cli", "report", str(results), "--format", "markdown", "--no-plots"],
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "# experiment: table" in out and "# experiment: staged" in out and "| 82.0 ± 2.0 (3) " in out
    assert "accuracy (%) at the final round; mean ± std over seeds" in out
    assert "runs: 10 finished, 1 failed (not in the table; --all includes them)" in out
    csv = run(
        [sys.executable, "-m", "jobs.cli", "report", str(results), "--format", "csv", "--no-plots"], cwd=ROOT
    )
    assert csv.returncode == 0, csv.stderr
    parsed = pd.read_csv(io.StringIO(csv.stdout))  # several experiments: still one table, experiment a column
    assert list(parsed.columns[:3]) == ["experiment", "dataset", "partition"]
    assert set(parsed["experiment"]) == {"table", "staged", "protocol"}
    assert parsed.set_index(["experiment", "partition"]).loc[("table", "#C=2"), "fedavg"] == "82.0 ± 2.0 (3)"
    bad = run(
        [sys.executable, "-m", "jobs.cli", "report", str(results), "--stage", "nope", "--no-plots"], cwd=ROOT
    )
    assert bad.returncode == 2 and "stage 'nope' was not recorded" in bad.stderr
    plots = run([sys.executable, "-m", "jobs.cli", "report", str(results), "--stage", "classifier"], cwd=ROOT)
    assert plots.returncode == 0 and (results / "plots" / "staged-accuracy-classifier.png").is_file()


def test_tuned_picks_each_algorithms_best_learning_rate(tmp_path):
    # The FedRC paper tunes every algorithm's lr over {0.01, 0.03, 0.06, 0.1}: runs that differ only
    # in lr share a cell, which shows the lr with the best mean over seeds, per algorithm.
    out = tmp_path / "out"
    base = {**small_config(tmp_path).to_dict(), "experiment": "lr", "hp": {}}
    for alg, by_lr in (
        ("fedavg", {0.01: [0.70, 0.72], 0.1: [0.80, 0.78]}),
        ("fedem", {0.01: [0.90, 0.88], 0.1: [0.60, 0.62]}),
    ):
        for lr, accs in by_lr.items():
            for seed, acc in enumerate(accs):
                write_run(out, {**base, "algorithm": alg, "lr": lr, "seed": seed}, final(acc))
    cells = pivot(run_values(out), rows=("dataset",), tuned=True).set_index("col")
    assert cells.loc["fedavg", "setting"] == "lr=0.1" and cells.loc["fedavg", "mean"] == pytest.approx(0.79)
    assert cells.loc["fedem", "setting"] == "lr=0.01" and cells.loc["fedem", "mean"] == pytest.approx(0.89)
    untuned = pivot(run_values(out), rows=("dataset",))
    assert sorted(untuned["col"]) == ["fedavg lr=0.01", "fedavg lr=0.1", "fedem lr=0.01", "fedem lr=0.1"]
    # a grid point only one seed has reached so far cannot win, however lucky that seed
    write_run(out, {**base, "algorithm": "fedavg", "lr": 0.03, "seed": 0}, final(0.99))
    cells = pivot(run_values(out), rows=("dataset",), tuned=True).set_index("col")
    assert cells.loc["fedavg", "setting"] == "lr=0.1" and cells.loc["fedavg", "n"] == 2
    # keys that cannot change a number never split a cell (keep_finished_checkpoints set on a sweep
    # under way: its earlier and later runs are seeds of one cell)
    write_run(
        out,
        {
            **base,
            "algorithm": "fedavg",
            "lr": 0.1,
            "seed": 2,
            "keep_finished_checkpoints": False,
            "checkpoint_every": 0,
        },
        final(0.76),
    )
    cells = pivot(run_values(out), rows=("dataset",), tuned=True).set_index("col")
    assert list(cells.index) == ["fedavg", "fedem"] and cells.loc["fedavg", "n"] == 3


def test_tuned_by_reads_one_metric_at_the_setting_another_picks(tmp_path):
    # FedRC's claim on purity: each algorithm's purity at the lr its accuracy picks (the paper tunes
    # the lr on accuracy), not at the lr of its best purity.
    out = tmp_path / "out"
    base = {**small_config(tmp_path).to_dict(), "experiment": "lr", "hp": {}}
    runs = {  # lr: per-seed (accuracy, purity)
        0.01: [(0.30, 0.90), (0.32, 0.94)],  # purer, less accurate
        0.1: [(0.40, 0.60), (0.44, 0.64)],
        0.06: [(0.99, 0.99)],  # one seed: cannot win either way
    }
    for lr, seeds in runs.items():
        for seed, (acc, pur) in enumerate(seeds):
            write_run(
                out,
                {**base, "algorithm": "fedrc", "lr": lr, "seed": seed},
                {1: [rec("accuracy", acc), rec("purity", pur), rec("train_accuracy", 0.5)]},
            )
    by_purity = pivot(run_values(out, "purity"), rows=("dataset",), tuned=True).iloc[0]
    assert by_purity["setting"] == "lr=0.01" and by_purity["mean"] == pytest.approx(0.92)
    at_accuracy = pivot(
        run_values(out, "purity"), rows=("dataset",), tuned=True, tuned_by=run_values(out)
    ).iloc[0]
    assert at_accuracy["setting"] == "lr=0.1" and at_accuracy["mean"] == pytest.approx(0.62)
    p = run(
        [
            sys.executable,
            "-m",
            "jobs.cli",
            "report",
            str(out),
            "--metric",
            "purity",
            "--tuned",
            "--tuned-by",
            "accuracy",
            "--no-plots",
            "--rows",
            "dataset",
        ],
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    assert (
        "62.0 ± 2.8 (2)" in p.stdout
        and "highest mean of accuracy" in p.stdout
        and "fedrc: lr=0.1" in p.stdout
    )
    p = run([sys.executable, "-m", "jobs.cli", "report", str(out), "--tuned-by", "accuracy"], cwd=ROOT)
    assert p.returncode == 2 and "--tuned-by chooses the setting of a --tuned cell" in p.stderr


def test_fidelity_cells_told_apart_by_more_fields(tmp_path):
    """A fidelity section's ``by: [lr]``: runs that differ only there are separate cells, each with
    its own mean over seeds, and the field is a column of the table."""
    from analysis.fidelity import cells, section_table

    base = {**small_config(tmp_path).to_dict(), "experiment": "t", "hp": {}}
    for lr, accs in ((0.01, [0.40, 0.60]), (0.1, [0.70, 0.72])):
        for seed, acc in enumerate(accs):
            write_run(tmp_path / "out", {**base, "lr": lr, "seed": seed}, final(acc))
    table = section_table(cells(tmp_path / "out", by=["lr"]), by=["lr"]).set_index("lr")
    assert table.loc["0.01", "fedray"] == "50.0 ± 14.1 (2)" and table.loc["0.1", "fedray"] == "71.0 ± 1.4 (2)"
    assert len(cells(tmp_path / "out")) == 1  # without it: one cell of all four runs


def test_fidelity_cells_count_runs_that_diverged(tmp_path):
    """fedray stops a run on non-finite metrics (failed, FloatingPointError); the reference trains on
    through NaN weights (summary diverged_round). Both are counted and left out of the values; a
    cell whose every run diverged is still a row; other failures are not divergence."""
    from analysis.fidelity import cells, section_table

    base = {**small_config(tmp_path).to_dict(), "experiment": "t", "hp": {}}
    out = tmp_path / "out"
    write_run(out, {**base, "seed": 0}, final(0.70))
    write_run(out, {**base, "seed": 1}, final(0.10), summary={"diverged_round": 2})  # the reference's NaN
    w = ResultsWriter(out, "fedavg-nan-s2", {**base, "seed": 2}, flush_every_s=0)
    w.start()
    w.fail("FloatingPointError: round 2: non-finite metrics {'loss': nan} (diverged? lower lr)")
    write_run(out, {**base, "seed": 3}, final(0.5), status="failed")  # RuntimeError: not divergence
    c = cells(out).iloc[0]
    assert c["values"] == [0.70] and c["diverged"] == 2
    only_nan = tmp_path / "nan"
    w = ResultsWriter(only_nan, "fedavg-nan-s0", {**base, "seed": 0}, flush_every_s=0)
    w.start()
    w.fail("FloatingPointError: round 1: non-finite metrics")
    c = cells(only_nan)
    assert len(c) == 1 and c.iloc[0]["values"] == [] and c.iloc[0]["diverged"] == 1
    table = section_table(c)
    assert table.loc[0, "fedray"] == "-" and table.loc[0, "diverged"] == "1"
    assert "reference" not in table  # no reference runs: no reference columns


def test_the_partition_of_a_data_set_of_client_files_is_its_folder():
    from analysis.report import partition_label

    base = {"partition": "dirichlet", "partition_beta": 0.5}
    assert partition_label(base) == "dirichlet(0.5)"
    # the default partition keys of a client_files run mean nothing: its clients are the files
    assert (
        partition_label({**base, "dataset": "client_files", "data_root": "/x/clients-60"})
        == "files:clients-60"
    )


def test_an_hp_added_after_a_run_reads_as_its_default_and_does_not_split_a_column():
    from analysis.report import run_flat

    # before optimizer_state
    old = run_flat({"algorithm": "fedcat", "hp": {}}, {"num_groups": 0, "epsilon": 0.1})
    new = run_flat(
        {"algorithm": "fedcat", "hp": {}}, {"num_groups": 0, "epsilon": 0.1, "optimizer_state": "fresh"}
    )
    assert old == new and old["hp.optimizer_state"] == "fresh"
    assert run_flat({"algorithm": "not_registered_here"}, {"a": 1})["hp.a"] == 1


def test_a_loss_is_best_at_its_lowest_and_a_metric_whose_name_does_not_tell_must_be_told(tmp_path):
    # `--at best`, `--tuned` and `--tuned-by` once read every metric's best as its highest: a loss's
    # worst round, and the lr with the highest loss picked.
    out = tmp_path / "out"
    base = {**small_config(tmp_path).to_dict(), "experiment": "lr", "hp": {}}
    curves = {  # lr: per seed, (loss, accuracy, mean_update_norm) for rounds 1, 2, 3
        0.01: [[(2.30, 0.40, 1.0), (2.20, 0.40, 0.9), (2.25, 0.40, 0.8)]] * 1
        + [[(2.28, 0.42, 1.0), (2.24, 0.42, 0.9), (2.26, 0.42, 0.8)]],
        0.1: [
            [(2.00, 0.88, 3.0), (0.50, 0.90, 2.0), (0.60, 0.89, 2.5)],
            [(1.90, 0.90, 3.0), (0.45, 0.92, 2.0), (0.55, 0.93, 2.5)],
        ],
    }
    for lr, seeds in curves.items():
        for seed, rounds in enumerate(seeds):
            write_run(
                out,
                {**base, "algorithm": "fedprox", "lr": lr, "seed": seed},
                {
                    r: [rec("loss", loss), rec("accuracy", acc), rec("mean_update_norm", norm)]
                    for r, (loss, acc, norm) in enumerate(rounds, start=1)
                },
            )
    best = run_values(out, "loss", at="best").set_index("run_id")
    assert sorted(best["value"]) == [0.45, 0.5, 2.2, 2.24] and set(best["round"]) == {2.0}
    final_ = pivot(run_values(out, "loss"), rows=("dataset",), tuned=True, better="lower").iloc[0]
    assert final_["setting"] == "lr=0.1" and final_["mean"] == pytest.approx(0.575)
    at_best = pivot(run_values(out, "loss", at="best"), rows=("dataset",), tuned=True, better="lower")
    assert at_best.iloc[0]["mean"] == pytest.approx(0.475)
    by_loss = pivot(
        run_values(out), rows=("dataset",), tuned=True, tuned_by=run_values(out, "loss"), better="lower"
    ).iloc[0]
    assert by_loss["setting"] == "lr=0.1" and by_loss["mean"] == pytest.approx(0.91)
    # a metric whose name does not say which way it improves: told, or refused before reading
    with pytest.raises(ReportError, match=r"'mean_update_norm' improves.*--better higher or --better lower"):
        run_values(out, "mean_update_norm", at="best")
    lowest = run_values(out, "mean_update_norm", at="best", better="lower")
    assert sorted(lowest["value"]) == [0.8, 0.8, 2.0, 2.0]

    def report(*flags):
        return run(
            [sys.executable, "-m", "jobs.cli", "report", str(out), "--no-plots", "--rows", "dataset", *flags],
            cwd=ROOT,
        )

    p = report("--metric", "loss", "--at", "best", "--tuned")
    assert p.returncode == 0, p.stderr
    assert "0.4750 ± 0.0354 (2)" in p.stdout and "its lowest value" in p.stdout
    assert "lowest mean over seeds" in p.stdout and "fedprox: lr=0.1" in p.stdout
    p = report("--tuned", "--tuned-by", "loss")
    assert p.returncode == 0 and "91.0 ± 2.8 (2)" in p.stdout and "lowest mean of loss" in p.stdout
    p = report("--metric", "mean_update_norm", "--tuned")
    assert p.returncode == 2 and "--tuned needs to know which way metric 'mean_update_norm'" in p.stderr
    p = report("--metric", "mean_update_norm", "--tuned", "--better", "lower")
    assert p.returncode == 0 and "fedprox: lr=0.01" in p.stdout, p.stderr


def test_a_finished_run_whose_last_rows_are_missing_has_no_final_value(tmp_path):
    # An earlier fedray could record a run finished with its last rounds' rows missing; the report
    # then printed an earlier round's accuracy as "the final round". It says nothing instead.
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import execute
    from fedray.storage.files import write_atomic

    cfg = small_config(tmp_path, rounds=3)
    list(execute(cfg, make_local_federation))
    assert run_values(cfg.output)["round"].tolist() == [3.0]
    (part,) = (tmp_path / "out" / "metrics").glob("*.parquet")
    table = pq.read_table(part)
    write_atomic(table.filter(pc.less(table.column("round"), 3)), part)  # round 3's rows gone
    got = run_values(cfg.output)
    assert got["round"].isna().all() and got["value"].isna().all()
    assert run_values(cfg.output, round=2)["round"].tolist() == [2.0]  # a round it has is still read
