"""docs/fidelity.md's machinery beyond the side-by-side cells: algorithms named with their hp, a
paper's orderings checked, LayerCFL's layer study read from the runs' gap and purity records, and a
section whose results folder is gone kept as it was."""

from __future__ import annotations

import math
import re

import pytest

from analysis.fidelity import (
    KEPT,
    FidelityError,
    algorithm_label,
    cells,
    claim_table,
    render,
    setting_order,
    tuned_choice,
)
from fedray.records import rec
from fedray.storage.writer import ResultsWriter
from tests.conftest import small_config
from tests.helpers import final, write_run

NAMES = {"fedcat": "FedCat", "fedcat concatenation=false": "FedCat w/ GC", "fedavg": "FedAvg"}


@pytest.fixture
def base(tmp_path):
    return {**small_config(tmp_path).to_dict(), "experiment": "t", "hp": {}}


def test_an_algorithm_with_hp_is_named_by_the_section(base):
    assert algorithm_label({**base, "algorithm": "fedcat"}, NAMES) == "FedCat"
    assert (
        algorithm_label({**base, "algorithm": "fedcat", "hp": {"concatenation": False}}, NAMES)
        == "FedCat w/ GC"
    )
    # not in names: the algorithm and its hp, so two settings never share a cell
    assert algorithm_label({**base, "algorithm": "fedprox", "hp": {"mu": 0.1}}, NAMES) == "fedprox mu=0.1"
    # several keys, sorted, and a list value whose commas are its own
    hp = {"layers": ["conv1", "fc1"], "eps1": 0.5}
    assert (
        algorithm_label({**base, "algorithm": "layercfl", "hp": hp}, {})
        == 'layercfl eps1=0.5 layers=["conv1", "fc1"]'
    )
    assert algorithm_label({**base, "algorithm": "fedcat", "hp": {"concatenation": False}}, None) == "fedcat"


def test_a_papers_orderings_checked_per_partition(tmp_path, base):
    out = tmp_path / "out"
    runs = {
        ("fedcat", ()): [0.80, 0.82],
        ("fedcat", (("concatenation", False),)): [0.78, 0.82],
        ("fedavg", ()): [0.60, 0.62],
    }
    for (alg, hp), accs in runs.items():
        for seed, acc in enumerate(accs):
            write_run(out, {**base, "algorithm": alg, "hp": dict(hp), "seed": seed}, final(acc))
    c = cells(out, names=NAMES)
    assert sorted(c["algorithm"]) == ["FedAvg", "FedCat", "FedCat w/ GC"]
    claims = [
        {"claim": "above the baseline", "above": "FedCat", "below": ["FedAvg"]},
        {"claim": "above the ablation", "above": ["FedCat"], "below": ["FedCat w/ GC"]},
        {"claim": "ablation above", "above": ["FedCat w/ GC"], "below": ["FedCat", "FedAvg"]},
        {"claim": "not run", "above": ["FedCat"], "below": ["SCAFFOLD"]},
    ]
    t = claim_table(c, claims).set_index("claim")
    # By hand, in points: FedCat 81 (var 2), FedAvg 61 (var 2): +20, SE sqrt(2/2 + 2/2) = 1.41.
    assert t.loc["above the baseline", "differences (points)"] == "FedCat − FedAvg: +20.0 (2 SE 2.8)"
    assert t.loc["above the baseline", "verdict"] == "holds"
    # FedCat w/ GC 80 (var 8): +1.0, SE sqrt(1 + 4) = 2.24: above only in the mean
    assert t.loc["above the ablation", "differences (points)"] == "FedCat − FedCat w/ GC: +1.0 (2 SE 4.5)"
    assert t.loc["above the ablation", "verdict"] == "holds in the means"
    assert t.loc["ablation above", "verdict"] == "does not hold (FedCat w/ GC not above FedCat)"
    assert t.loc["not run", "verdict"] == "not run"
    with pytest.raises(FidelityError, match="needs above: and below:"):
        claim_table(c, [{"claim": "x", "above": "FedCat"}])
    # a reference's runs in the folder: the claim is checked on them too, in rows of their own
    for seed, acc in enumerate([0.50, 0.52]):
        write_run(out, {**base, "algorithm": "fedcat", "seed": seed, "source": "authors/FedCat"}, final(acc))
    for seed, acc in enumerate([0.60, 0.62]):
        write_run(out, {**base, "algorithm": "fedavg", "seed": seed, "source": "authors/FedCat"}, final(acc))
    t = claim_table(cells(out, names=NAMES), claims[:1])
    assert t["source"].tolist() == ["fedray", "authors/FedCat"]
    assert t["verdict"].tolist() == ["holds", "does not hold (FedCat not above FedAvg)"]
    # another paper's reference in the same folder, with none of the claim's algorithms: no row
    write_run(out, {**base, "algorithm": "fedrs", "seed": 0, "source": "authors/FedRS"}, final(0.6))
    t = claim_table(cells(out, names=NAMES), claims[:1])
    assert t["source"].tolist() == ["fedray", "authors/FedCat"]


def test_a_claim_reads_the_references_pooled_each_algorithm_from_its_own_authors(tmp_path, base):
    # FedRS from its author's code, FedAvg from another reference, on the same clients; a third reference
    # with neither algorithm is left out of the pooled side
    out = tmp_path / "out"
    for seed, (rs, avg) in enumerate([(0.70, 0.60), (0.72, 0.62)]):
        write_run(out, {**base, "algorithm": "fedrs", "seed": seed, "source": "authors/FedRS"}, final(rs))
        write_run(out, {**base, "algorithm": "fedavg", "seed": seed, "source": "authors/Bench"}, final(avg))
        write_run(out, {**base, "algorithm": "fedrs", "seed": seed}, final(avg))
        write_run(out, {**base, "algorithm": "fedavg", "seed": seed}, final(rs))
    write_run(out, {**base, "algorithm": "moon", "seed": 0, "source": "authors/MOON"}, final(0.5))
    names = {"fedrs": "FedRS", "fedavg": "FedAvg", "moon": "MOON"}
    claim = {"claim": "FedRS above FedAvg", "above": ["FedRS"], "below": ["FedAvg"]}
    apart = claim_table(cells(out, names=names), [claim])
    assert apart["verdict"].tolist() == ["does not hold (FedRS not above FedAvg)", "not run", "not run"]
    t = claim_table(cells(out, names=names), [{**claim, "references": "pooled"}])
    assert t["source"].tolist() == ["fedray", "the references (authors/Bench, authors/FedRS)"]
    # by hand: 71 against 61 (each var 2): +10.0, 2 SE = 2 sqrt(1 + 1) = 2.8
    assert t["differences (points)"].tolist()[1] == "FedRS − FedAvg: +10.0 (2 SE 2.8)"
    assert t["verdict"].tolist() == ["does not hold (FedRS not above FedAvg)", "holds"]
    # two references with the same algorithm cannot be pooled
    write_run(out, {**base, "algorithm": "fedavg", "seed": 0, "source": "authors/FedRS"}, final(0.5))
    with pytest.raises(
        FidelityError, match="fedavg on .* more than one reference|FedAvg on .* more than one"
    ):
        claim_table(cells(out, names=names), [{**claim, "references": "pooled"}])
    with pytest.raises(FidelityError, match="each or pooled"):
        claim_table(cells(out, names=names), [{**claim, "references": "all"}])


def test_a_claim_in_a_section_with_by_fields_names_which_cell(tmp_path, base):
    # by: [head_bias]: fedray ran FedRS with and without the head's bias, the author's code without;
    # a bare "fedrs" would be two cells on fedray's side: an error naming them, never a silent pick
    out = tmp_path / "out"
    for seed, (with_bias, without, avg, ref) in enumerate(
        [(0.70, 0.60, 0.64, 0.66), (0.72, 0.62, 0.66, 0.68)]
    ):
        write_run(out, {**base, "algorithm": "fedrs", "seed": seed}, final(with_bias))
        write_run(out, {**base, "algorithm": "fedrs", "seed": seed, "head_bias": False}, final(without))
        write_run(out, {**base, "algorithm": "fedavg", "seed": seed}, final(avg))
        write_run(
            out,
            {**base, "algorithm": "fedrs", "seed": seed, "head_bias": False, "source": "authors/R"},
            final(ref),
        )
    c = cells(out, by=["head_bias"])
    with pytest.raises(
        FidelityError,
        match=r"fedrs has 2 cells on .*\(fedrs head_bias=true, fedrs head_bias=false|"
        r"fedrs has 2 cells on .*\(fedrs head_bias=false, fedrs head_bias=true",
    ):
        claim_table(c, [{"claim": "x", "above": ["fedrs"], "below": ["fedavg"]}], ["head_bias"])
    claim = {"claim": "x", "above": ["fedrs head_bias=false"], "below": ["fedavg"]}
    t = claim_table(c, [claim], ["head_bias"])
    # fedray without the bias: 61 against 65 (each var 2): -4.0, 2 SE 2.8; the reference has no FedAvg
    assert t["differences (points)"].tolist() == [
        "fedrs head_bias=false − fedavg: -4.0 (2 SE 2.8)",
        "fedrs head_bias=false − fedavg: not run",
    ]
    assert t["verdict"].tolist() == ["does not hold (fedrs head_bias=false not above fedavg)", "not run"]
    # a typo in the by-value
    with pytest.raises(FidelityError, match="no cell named 'fedrs head_bias=False'"):
        claim_table(c, [{**claim, "above": ["fedrs head_bias=False"]}], ["head_bias"])
    with_bias = claim_table(c, [{**claim, "above": ["fedrs head_bias=true"]}], ["head_bias"])
    assert with_bias["differences (points)"].tolist()[0] == "fedrs head_bias=true − fedavg: +6.0 (2 SE 2.8)"


def test_a_section_reads_only_the_runs_its_where_keeps(tmp_path, base):
    # an lr grid beside the section's runs (lr 0.06) in the same folder
    out = tmp_path / "out"
    for seed, (a, b) in enumerate([(0.60, 0.90), (0.62, 0.92)]):
        write_run(out, {**base, "lr": 0.06, "seed": seed}, final(a))
        write_run(out, {**base, "lr": 0.1, "seed": seed}, final(b))
    everything = cells(out)  # without where: both lrs in one cell (the section would mix them)
    assert [sorted(v) for v in everything["values"]] == [[0.60, 0.62, 0.90, 0.92]]
    kept = cells(out, where={"lr": 0.06})
    assert kept["values"].tolist() == [[0.60, 0.62]]
    assert cells(out, where={"lr": 0.03}).empty
    assert [sorted(v) for v in cells(out, where={"lr": [0.03, 0.1]})["values"]] == [[0.90, 0.92]]  # one of
    # a key whose own value is a list is matched as a whole
    write_run(out, {**base, "lr": 0.2, "seed": 0, "synthetic_shape": [1, 4, 4]}, final(0.5))
    assert cells(out, where={"synthetic_shape": [1, 4, 4]})["values"].tolist() == [[0.5]]
    with pytest.raises(FidelityError, match="no run has the config key 'lrr'"):
        cells(out, where={"lrr": 0.06})


def test_a_tuned_section_takes_each_sides_best_learning_rate(tmp_path, base):
    # The FedRC paper tunes each algorithm's lr: each side's cell is its best lr, chosen among the lrs
    # run with the most seeds, the fewest diverged, then the best mean; every lr's mean is shown.
    out = tmp_path / "out"
    runs = {  # (algorithm, source, lr): per-seed accuracy; None = diverged
        ("fedavg", "fedray", 0.03): [0.60, 0.64],
        ("fedavg", "fedray", 0.06): [0.70, 0.66],
        ("fedavg", "authors/X", 0.03): [0.50, 0.54],
        ("fedavg", "authors/X", 0.06): [0.40, 0.42],
        ("fedavg", "authors/X", 0.1): [0.90],  # one seed only: cannot win over two
        # best mean, diverged once
        ("fedrc", "fedray", 0.03): [0.50, 0.52],
        ("fedrc", "fedray", 0.1): [0.95, None],
    }
    for (alg, source, lr), accs in runs.items():
        for seed, acc in enumerate(accs):
            cfg = {**base, "algorithm": alg, "lr": lr, "seed": seed, "source": source}
            if acc is None:
                write_run(out, cfg, final(0.1), status="failed", error="FloatingPointError: non-finite loss")
            else:
                write_run(out, cfg, final(acc))
    c = cells(out, tuned=["lr"]).set_index(["algorithm", "source"])
    assert c.loc[("fedavg", "fedray"), "setting"] == "lr=0.06"  # 68 against 62
    assert sorted(c.loc[("fedavg", "fedray"), "values"]) == [0.66, 0.70]
    assert c.loc[("fedavg", "authors/X"), "setting"] == "lr=0.03"  # 52 against 41; lr 0.1 has one seed
    assert c.loc[("fedrc", "fedray"), "setting"] == "lr=0.03"  # lr 0.1 diverged once
    assert c.loc[("fedrc", "fedray"), "grid"]["lr=0.1"] == ([0.95], 1)
    spec = {
        "sections": [
            {
                "title": "Tuned",
                "results": "out",
                "tuned": ["lr"],
                "claims": [{"claim": "c", "above": ["fedavg"], "below": ["fedrc"]}],
            }
        ]
    }
    page = render(spec, tmp_path)
    flat = re.sub(r" +", " ", page)
    # fedray 68.0 ± 2.8 against the reference's 52.0 ± 2.8: +16.0; each side's lr named
    assert "| fedavg | 68.0 ± 2.8 (2) | lr=0.06 | 52.0 ± 2.8 (2) [authors/X] | lr=0.03 | +16.0 |" in flat
    assert "| source | lr=0.03 | lr=0.06 | lr=0.1 |" in flat  # the settings by value
    assert sorted(["lr=0.1", "lr=0.06", "lr=1e-05", "lr=default"], key=setting_order) == [
        "lr=1e-05",
        "lr=0.06",
        "lr=0.1",
        "lr=default",
    ]
    assert "| fedavg | fedray | 62.0 ± 2.8 (2) | **68.0 ± 2.8 (2)** | - |" in flat
    assert "| fedavg | authors/X | **52.0 ± 2.8 (2)** | 41.0 ± 1.4 (2) | 90.0 (1) |" in flat
    assert "| fedrc | fedray | **51.0 ± 1.4 (2)** | - | 95.0 (1), 1 diverged |" in flat
    # the claim reads the tuned cells: fedray's FedAvg 68 against FedRC's 51 at lr 0.03
    assert "fedavg − fedrc: +17.0" in page
    with pytest.raises(FidelityError, match="tuned: 'lrr' is no run's config key"):
        cells(out, tuned=["lrr"])
    with pytest.raises(FidelityError, match="tuned: 'lr' is also in by:"):
        cells(out, by=["lr"], tuned=["lr"])
    # ties go to the first listed; a cell whose every setting diverged keeps its first
    assert tuned_choice({"a": ([0.5, 0.75], 0), "b": ([0.625, 0.625], 0)}) == "a"
    assert tuned_choice({"a": ([], 2), "b": ([], 2)}) == "a"
    # a setting that diverged in every run cannot win (halfway through a grid: lr 0.1 diverged thrice)
    assert tuned_choice({"lr=0.1": ([], 3), "lr=0.03": ([0.5, 0.6], 0)}) == "lr=0.03"
    # a run not read (NaN) is no seed, whatever the order
    nan = float("nan")
    assert tuned_choice({"a": ([nan], 0), "b": ([0.5], 0)}) == "b"
    assert tuned_choice({"b": ([0.5], 0), "a": ([nan], 0)}) == "b"


def test_a_tuned_section_can_read_purity_at_the_lr_accuracy_picks(tmp_path, base):
    # The paper tunes the lr on accuracy; its purity claim is read at that lr, on each side.
    out = tmp_path / "out"
    runs = {  # (source, lr): per-seed (accuracy, purity)
        ("fedray", 0.03): [(0.20, 0.90), (0.22, 0.80)],
        ("fedray", 0.1): [(0.26, 0.70), (0.28, 0.60)],
        ("authors/X", 0.03): [(0.24, 0.50), (0.26, 0.70)],
        ("authors/X", 0.1): [(0.10, 0.99), (0.12, 0.97)],
    }
    for (source, lr), seeds in runs.items():
        for seed, (acc, pur) in enumerate(seeds):
            cfg = {**base, "algorithm": "fedrc", "lr": lr, "seed": seed, "source": source}
            write_run(out, cfg, {1: [rec("accuracy", acc), rec("purity", pur), rec("train_accuracy", 0.5)]})
    read = {"metric": "purity"}
    c = cells(out, read, tuned=["lr"], tuned_by={"metric": "accuracy"}).set_index("source")
    assert c.loc["fedray", "setting"] == "lr=0.1" and sorted(c.loc["fedray", "values"]) == [0.60, 0.70]
    assert c.loc["authors/X", "setting"] == "lr=0.03" and sorted(c.loc["authors/X", "values"]) == [0.50, 0.70]
    assert c.loc["fedray", "grid"]["lr=0.03"] == ([0.90, 0.80], 0)  # the grid shows what is read
    by_purity = cells(out, read, tuned=["lr"]).set_index("source")  # without tuned_by: purity's own best
    assert (
        by_purity.loc["fedray", "setting"] == "lr=0.03" and by_purity.loc["authors/X", "setting"] == "lr=0.1"
    )
    spec = {
        "sections": [
            {
                "title": "Purity",
                "results": "out",
                "tuned": ["lr"],
                "read": read,
                "tuned_by": {"metric": "accuracy"},
            }
        ]
    }
    flat = re.sub(r" +", " ", render(spec, tmp_path))
    assert "then the best mean of accuracy at the final round):" in flat
    assert "| fedrc | fedray | 85.0 ± 7.1 (2) | **65.0 ± 7.1 (2)** |" in flat
    with pytest.raises(FidelityError, match="tuned_by chooses the setting of a tuned cell"):
        cells(out, read, tuned_by={"metric": "accuracy"})


def test_a_tuned_hp_key_is_the_setting_not_part_of_the_name_and_a_default_is_its_value(tmp_path, base):
    # tuned: [hp.mu] with names: mu is the setting, so FedProx stays one named cell; a run that
    # leaves mu at its default (0.001, which its summary records) is the same setting as mu=0.001
    out = tmp_path / "out"
    for seed, (low, high) in enumerate([(0.60, 0.70), (0.62, 0.72)]):
        write_run(
            out,
            {**base, "algorithm": "fedprox", "seed": seed},
            final(low),
            summary={"hparams": {"mu": 0.001}},
        )
        write_run(
            out, {**base, "algorithm": "fedprox", "seed": seed + 2, "hp": {"mu": 0.001}}, final(low + 0.02)
        )
        write_run(out, {**base, "algorithm": "fedprox", "seed": seed, "hp": {"mu": 0.1}}, final(high))
    c = cells(out, names={"fedprox": "FedProx"}, tuned=["hp.mu"])
    assert c["algorithm"].tolist() == ["FedProx"]
    assert set(c["grid"].iloc[0]) == {"hp.mu=0.001", "hp.mu=0.1"}
    assert len(c["grid"].iloc[0]["hp.mu=0.001"][0]) == 4  # explicit and default: one setting, 4 seeds
    assert c["setting"].iloc[0] == "hp.mu=0.001"  # 4 seeds run against 2: only it competes
    # a by: field with a dot in its name reaches the grid table
    from analysis.fidelity import grid_table

    dotted = tmp_path / "dotted"
    for mu, lr, acc in ((0.001, 0.01, 0.5), (0.001, 0.1, 0.6), (0.1, 0.01, 0.7)):
        write_run(dotted, {**base, "algorithm": "fedprox", "seed": 0, "lr": lr, "hp": {"mu": mu}}, final(acc))
    c = cells(dotted, by=["hp.mu"], names={"fedprox": "FedProx"}, tuned=["lr"])
    t = grid_table(c, ["hp.mu"])
    assert t["algorithm"].tolist() == ["FedProx", "FedProx"] and t["hp.mu"].tolist() == ["0.001", "0.1"]
    assert t["lr=0.1"].tolist() == ["**60.0 (1)**", "-"] and t["lr=0.01"].tolist() == [
        "50.0 (1)",
        "**70.0 (1)**",
    ]


def test_one_seed_a_side_gives_no_agreement_verdict(tmp_path, base):
    # with one seed on each side no seed-to-seed spread is known: the difference, and no yes/NO
    from analysis.fidelity import section_table

    out = tmp_path / "out"
    write_run(out, {**base, "seed": 0}, final(0.70))
    write_run(out, {**base, "seed": 0, "source": "authors/X"}, final(0.73))
    row = section_table(cells(out)).iloc[0]
    assert row["difference"] == "-3.0" and row["agree (tolerance)"] == "- (one seed a side)"
    write_run(out, {**base, "seed": 1, "source": "authors/X"}, final(0.75))  # the reference's spread is known
    row = section_table(cells(out)).iloc[0]
    # 70 against 74 (var 2, borrowed by fedray's side): -4.0, SE sqrt(2 + 1) = 1.73, tolerance 3.5
    assert row["difference"] == "-4.0" and row["agree (tolerance)"] == "NO (±3.5)"


def test_a_missing_results_folder_is_an_error_or_the_section_as_last_generated(tmp_path, base):
    write_run(tmp_path / "here", {**base, "seed": 0}, final(0.7))
    spec = {
        "title": "T",
        "sections": [{"title": "Here", "results": "here"}, {"title": "Gone", "results": "gone"}],
    }
    with pytest.raises(FidelityError, match="'Gone': results folder .*gone.* does not exist"):
        render(spec, tmp_path)
    previous = (
        "# T\n\n## Here\n\nstale text\n\n## Gone\n\n| a |\n|---|\n| 70.0 (1) |\n\nnotes of the gone section\n"
    )
    page = render(spec, tmp_path, previous=previous)
    gone = page.split("## Gone\n", 1)[1]
    assert gone.strip().startswith("_(This section's results folder")
    assert "| 70.0 (1) |" in gone and "notes of the gone section" in gone
    assert "stale text" not in page.split("## Gone")[0]  # a section whose folder is here is regenerated
    again = render(spec, tmp_path, previous=page)
    assert again == page  # kept twice: marked once
    assert KEPT.split("{")[0] in page


def _layer_run(out, base, seed, size, eps1, gaps, extra=None, groups=(0, 0, 1, 1)):
    cfg = {
        **base,
        "algorithm": "cfl",
        "partition": "rotation",
        "partition_size": size,
        "seed": seed,
        "hp": {"eps1": eps1},
        "rounds": len(gaps),
    }
    run_id = f"cfl-{size}-{eps1}-s{seed}"
    w = ResultsWriter(out, run_id, cfg, flush_every_s=0)
    w.start()
    w.write_clients(
        [
            {
                "client": c,
                "role": "train",
                "num_train": size,
                "num_test": 0,
                "group": g,
                "concept": "",
                "corruption": "",
                "severity": 0,
            }
            for c, g in enumerate(groups)
        ]
    )
    for r, (g_all, g_conv) in enumerate(gaps, start=1):
        w.add(
            r,
            [
                rec("gap", g_all),
                rec("gap_l2", g_all / 2),
                rec("gap/conv1", g_conv),
                rec("gap_l2/conv1", g_conv),
                rec("accuracy", 0.5),
                *(extra or {}).get(r, []),
            ],
        )
    w.finish({})
    return run_id


def test_layer_study_reads_rounds_until_separation_layer_gaps_and_the_true_clustering(tmp_path, base):
    from analysis import layer_study as L

    out = tmp_path / "out"
    # never-splitting runs: all layers separate at round 2 (seed 0) and 3 (seed 1); conv1 never
    _layer_run(out, base, 0, 100, 0.0, [(-0.1, -1.0), (0.2, -1.0), (0.3, -0.5)])
    _layer_run(out, base, 1, 100, 0.0, [(-0.1, -1.0), (-0.2, -1.0), (0.1, -0.5)])
    # more data: separate at round 1
    _layer_run(out, base, 0, 500, 0.0, [(0.4, 0.1), (0.5, 0.2), (0.6, 0.3)])
    # a splitting run: one cluster, a wrong split, then the truth (2 clusters, purity 1) at round 3
    per_round = {
        1: [rec("purity", 1.0), rec("num_clusters", 1)],
        2: [rec("purity", 0.5), rec("num_clusters", 2), rec("split", 1, scope="cluster", entity=0)],
        3: [rec("purity", 1.0), rec("num_clusters", 2)],
    }
    _layer_run(out, base, 0, 100, 0.4, [(0.0, 0.0)] * 3, per_round)
    onset = L.gap_onset(out).set_index(["size", "distance", "layers", "seed"])["onset"]
    assert onset[(100, "Delta-cos", L.ALL, 0)] == 2 and onset[(100, "Delta-cos", L.ALL, 1)] == 3
    assert math.isnan(onset[(100, "Delta-cos", "conv1", 0)])
    assert onset[(100, "L2", L.ALL, 0)] == 2 and onset[(500, "Delta-cos", L.ALL, 0)] == 1
    assert len(L.gap_onset(out)) == 3 * 4  # the splitting run is not in the layer study
    t = L.onset_table(L.gap_onset(out)).set_index(["distance", "layers"])
    assert list(t.columns[-2:]) == ["100 samples/client", "500 samples/client"]  # by size, not by appearance
    assert t.loc[("Delta-cos", L.ALL), "100 samples/client"] == "2.5 ± 0.7 (2)"
    assert t.loc[("Delta-cos", "conv1"), "100 samples/client"] == "never (≤ 3) (2)"
    # and how many rounds the separation lasted: 2 (seed 0) and 1 (seed 1)
    kept = L.onset_table(L.gap_onset(out), "positive").set_index(["distance", "layers"])
    assert kept.loc[("Delta-cos", L.ALL), "100 samples/client"] == "1.5 ± 0.7 (2)"
    gaps = L.gaps_at(out, [1, 3], 100).set_index(["distance", "layers", "round"])
    assert gaps.loc[("Delta-cos", L.ALL, 3), "mean"] == pytest.approx(0.2)  # (0.3 + 0.1) / 2
    assert gaps.loc[("Delta-cos", L.ALL, 1), "mean"] == pytest.approx(-0.1)
    assert gaps.loc[("L2", "conv1", 3), "mean"] == pytest.approx(-0.5)
    p = L.purity_onset(out).iloc[0]
    assert (p["onset"], p["purity"], p["clusters"], p["groups"], p["splits"]) == (3.0, 1.0, 2, 2, [2])
    parts = L.section(out, tmp_path / "docs", {"rounds": [1, 3], "size": 100, "prefix": "study"})
    text = "\n".join(parts)
    assert "Rounds until gap > 0" in text and "Gap per layer** at rounds 1, 3" in text and "| CFL " in text
    pytest.importorskip("matplotlib")
    assert {"study-onset.png", "study-layers.png", "study-purity.png"} <= {
        p.name for p in (tmp_path / "docs").iterdir()
    }


def test_archive_keeps_the_finished_runs_tables_beside_the_page(tmp_path, base):
    # Results live on the machine that ran them; `fedray fidelity --archive DIR` copies what the page
    # reads of DIR's finished and diverged runs into ROOT/NAME (one file per table, no checkpoints),
    # replacing it. A run that failed for another reason is not a result and stays behind.
    import yaml

    from analysis import load_metrics, load_runs
    from tests.conftest import ROOT
    from tests.helpers import FEDRAY, run

    src = tmp_path / "batch"
    done = write_run(src, {**base, "seed": 0}, final(0.7))
    write_run(src, {**base, "seed": 1}, final(0.2), status="failed")
    nan = write_run(
        src, {**base, "seed": 2}, final(0.1), status="failed", error="FloatingPointError: non-finite loss"
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump({"root": str(tmp_path / "kept"), "sections": [{"title": "S", "results": "batch"}]})
    )
    stale = tmp_path / "kept" / "batch" / "metrics"
    stale.mkdir(parents=True)
    (stale / "old.parquet").write_bytes((next((src / "metrics").iterdir())).read_bytes())
    p = run(
        [*FEDRAY, "fidelity", str(spec), "--archive", str(src), "-o", str(tmp_path / "page.md")], cwd=ROOT
    )
    assert p.returncode == 0, p.stderr
    kept = tmp_path / "kept" / "batch"
    assert sorted(load_runs(kept)["run_id"]) == sorted([done, nan])
    assert [f.name for f in (kept / "metrics").iterdir()] == ["archive.parquet"]  # the stale file is gone
    original = load_metrics(src)
    kept_metrics = load_metrics(kept).sort_values(["run_id", "round", "metric"]).reset_index(drop=True)
    expected = original[original["run_id"].isin([done, nan])].sort_values(["run_id", "round", "metric"])
    assert kept_metrics.equals(expected.reset_index(drop=True))
    page = (tmp_path / "page.md").read_text()
    assert "70.0 (1)" in page and "| diverged" in page  # the diverged run is counted, not averaged
