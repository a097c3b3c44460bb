"""The reference registry (jobs/reference/registry.py): every reference is one `Reference` record in
one dict, which the command line reads for its names, help, options and dispatch; an option a
reference does not take is refused naming both; the harness's hyperparameters come from the
algorithm registry, so a changed default cannot drift from it."""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from fedray.algorithms import ALGORITHMS
from fedray.experiment.checks import from_dict
from jobs.cli import build_parser
from jobs.cli import main as cli
from jobs.reference import fedrc
from jobs.reference.cli import reference_options
from jobs.reference.niid_bench import FEDCONCAT, NIID_BENCH, eval_round
from jobs.reference.record import CHECK, Option, Reference, ReferenceError
from jobs.reference.registry import REFERENCES, options

ROOT = Path(__file__).resolve().parents[2]


def test_every_reference_is_one_record_type_in_one_registry():
    assert list(REFERENCES) == ["fedconcat", "niid-bench", "fedrepo", "fl-bench", "fedrc"]
    for name, ref in REFERENCES.items():
        assert type(ref) is Reference and ref.name == name
        assert all(type(o) is Option for o in ref.options)
        assert (ref.check is not None) == (CHECK in ref.options)
    # the command line's help names every registered reference and every option some reference takes
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    text = sub.choices["reference"].format_help()
    assert all(name in text for name in REFERENCES) and all(flag in text for flag in options())
    with pytest.raises(ValueError, match="--check among its options and a check hook go together"):
        replace(FEDCONCAT, check=None)
    with pytest.raises(ValueError, match="the generic path needs args"):
        Reference("x", "a/b", "abc", "s.py", "w", frozenset())


def test_building_the_command_line_imports_no_torch():
    # the registry is read when every `fedray` command line is built: no reference module may import
    # torch, the data sets or the algorithms at import time
    code = (
        "import sys, jobs.cli; jobs.cli.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith(('fedray.data', "
        "'fedray.algorithms'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _value(opt: Option) -> list[str]:
    if opt.switch:
        return [opt.flag]
    return [opt.flag, opt.choices[0] if opt.choices else "1"]


@pytest.mark.parametrize(
    "name,opt",
    [(n, o) for n, ref in REFERENCES.items() for o in options().values() if o not in ref.options],
    ids=lambda v: v if isinstance(v, str) else v.flag,
)
def test_an_option_a_reference_does_not_take_is_refused_naming_both(tmp_path, capsys, name, opt):
    rc = cli(
        ["reference", name, "x.yaml", "--checkout", str(tmp_path), "--output", str(tmp_path), *_value(opt)]
    )
    err = capsys.readouterr().err
    assert rc == 2 and f"fedray: error: {name}: {opt.flag} does not apply" in err, err
    assert not (tmp_path / "reference").exists()  # refused before anything ran


def test_the_options_a_reference_takes_come_with_its_defaults():
    parser = build_parser()

    def opts(*argv: str) -> dict:
        args = parser.parse_args(["reference", argv[0], "--checkout", ".", "--output", "o", *argv[1:]])
        return reference_options(REFERENCES[argv[0]], args)

    assert opts("niid-bench") == {
        "force": False,
        "partitions_only": False,
        "keep_logging_evals": False,
        "state_dict": "copies",
        "check": False,
    }
    assert opts("fedconcat", "--state-dict", "views", "--force")["state_dict"] == "views"
    assert opts("fedrc", "--clients", "60") == {"seed": 0, "python": None, "clients": 60, "device": "cpu"}
    assert opts("fedrepo") == opts("fl-bench") == {"force": False}
    with pytest.raises(ReferenceError, match=r"fl-bench: --device does not apply \(only fedrc takes it\)"):
        opts("fl-bench", "--device", "cpu")


def _niid(**over):
    base = dict(
        dataset="fmnist",
        model="simple_cnn",
        num_clients=10,
        partition="labels",
        partition_k=2,
        rounds=69,
        local_epochs=1,
        batch_size=64,
        lr=0.01,
        momentum=0.9,
        weight_decay=1e-5,
    )
    return from_dict({**base, **over})


def _fedrc(algorithm: str):
    script = {
        "persistent_optimizer": True,
        "drop_last": True,
        "empty_cluster": "zero",
        "switch": "untrained",
        "first_round": "split",
    }
    hp = {k: v for k, v in script.items() if k in ALGORITHMS[algorithm].full_hparams({})}
    cfg = from_dict(
        {
            "dataset": "digits",
            "model": "mlp",
            "momentum": 0.9,
            "weight_decay": 5e-4,
            "algorithm": algorithm,
            "hp": hp,
        }
    )
    return replace(cfg, dataset="client_files")


def _pairs(args: list[str]) -> dict[str, str]:
    return {a: b for a, b in zip(args, args[1:], strict=False) if a.startswith("--")}


def _harness_values(fedrc_algs: tuple[str, ...]) -> dict:
    """Every hyperparameter a harness writes into a script's arguments, for configs naming none."""
    d, logs = Path("/data"), Path("/logs")
    got = {("fedprox", "mu"): float(_pairs(FEDCONCAT.args(_niid(algorithm="fedprox"), d, logs))["--mu"])}
    moon = _pairs(NIID_BENCH.args(_niid(algorithm="moon"), d, logs))
    got |= {
        ("moon", "mu"): float(moon["--mu"]),
        ("moon", "temperature"): float(moon["--temperature"]),
        ("moon", "out_dim"): int(moon["--out_dim"]),
    }
    concat = _pairs(FEDCONCAT.args(_niid(algorithm="fedconcat"), d, logs))
    got |= {
        ("fedconcat", "num_clusters"): int(concat["--n_clusters"]),
        ("fedconcat", "encoder_rounds"): int(concat["--encoder_round"]),
        ("fedconcat", "eps"): float(concat["--eps"]),
        ("fedconcat", "eval_round"): eval_round(_niid(algorithm="fedconcat"), 0)[0] - 1,
    }
    for alg in fedrc_algs:
        got[(alg, "num_clusters")] = int(_pairs(fedrc.script_args(_fedrc(alg), "x"))["--n_learners"])
    return got


FEDRC_K = ("fedem", "fedrc", "ifca", "fesem")


def test_the_harness_hyperparameter_defaults_are_the_registrys(monkeypatch):
    got = _harness_values(FEDRC_K)
    assert got == {
        (alg, key): ALGORITHMS[alg].full_hparams({})[key.replace("eval_round", "encoder_rounds")]
        for alg, key in got
    }
    # and they follow the registry: a changed default changes what the harness writes
    configs = {alg: _fedrc(alg) for alg in FEDRC_K}  # validated before the registry changes

    class Changed:
        def __init__(self, alg, **new):
            self.alg, self.new = alg, new

        def full_hparams(self, values):
            return {**self.alg.full_hparams({}), **self.new, **values}

    changes = {
        "fedprox": {"mu": 0.25},
        "moon": {"mu": 2.0, "temperature": 0.75, "out_dim": 64},
        "fedconcat": {"num_clusters": 4, "encoder_rounds": 20, "eps": 0.5},
    }
    changes |= {alg: {"num_clusters": 2} for alg in FEDRC_K}
    niid = {alg: _niid(algorithm=alg) for alg in ("fedprox", "moon", "fedconcat")}
    for alg, new in changes.items():
        monkeypatch.setitem(ALGORITHMS, alg, Changed(ALGORITHMS[alg], **new))
    d, logs = Path("/data"), Path("/logs")
    assert _pairs(FEDCONCAT.args(niid["fedprox"], d, logs))["--mu"] == "0.25"
    moon = _pairs(NIID_BENCH.args(niid["moon"], d, logs))
    assert (moon["--mu"], moon["--temperature"], moon["--out_dim"]) == ("2", "0.75", "64")
    concat = _pairs(FEDCONCAT.args(niid["fedconcat"], d, logs))
    assert (
        concat["--n_clusters"],
        concat["--encoder_round"],
        concat["--classifier_round"],
        concat["--eps"],
    ) == ("4", "20", "49", "0.5")
    assert eval_round(niid["fedconcat"], 0) == (21, "classifier")
    for cfg in configs.values():
        assert _pairs(fedrc.script_args(cfg, "x"))["--n_learners"] == "2"


def test_the_wrapper_path_hands_the_options_to_the_wrapper(monkeypatch):
    from jobs.reference import harness

    seen = []

    def run_reference(ref, runs, checkout, out, jobs, threads, extra, force, partitions_only):
        seen.append((list(extra), force, partitions_only))
        return 0, 0

    monkeypatch.setattr(harness, "run_reference", run_reference)
    defaults = {o.dest: o.default for o in NIID_BENCH.options}
    for given, want in [
        ({}, (["--state-dict", "copies"], False, False)),
        (
            {"state_dict": "views", "keep_logging_evals": True},
            (["--state-dict", "views", "--keep-logging-evals"], False, False),
        ),
        ({"partitions_only": True}, (["--state-dict", "copies", "--partition-only"], True, True)),
        ({"force": True}, (["--state-dict", "copies"], True, False)),
    ]:
        harness.run_wrapped(NIID_BENCH, [], Path("c"), Path("o"), 1, 0, defaults | given)
        assert seen.pop() == want
    harness.run_wrapped(REFERENCES["fedrepo"], [], Path("c"), Path("o"), 1, 0, {"force": False})
    assert seen.pop() == ([], False, False)


def test_a_record_with_its_own_clients_and_runner_is_driven_by_its_hooks(tmp_path, monkeypatch, capsys):
    # what FedRC's record does (clients from its own generator, its own runner), on a record made here:
    # registered, it is a reference of the command line like the others
    calls: dict = {}

    def clients(checkout, out, options):
        calls["clients"] = (checkout, out, dict(options))
        return out / "clients", ["num_clients=7"]

    def run(ref, runs, checkout, out, jobs, threads, options):
        calls["run"] = (ref.name, [c.num_clients for c in runs], jobs, threads)
        return 1  # one run failed

    fake = Reference(
        "fake",
        "someone/fake",
        "abc",
        "run.py",
        "w",
        frozenset({"fedavg"}),
        clients=clients,
        run=run,
        check_run=lambda cfg: calls.setdefault("checked", []).append(cfg.seed),
    )
    monkeypatch.setitem(REFERENCES, "fake", fake)
    monkeypatch.setenv("FEDRAY_REFERENCE_ANY_COMMIT", "1")
    checkout, out = tmp_path / "fake", tmp_path / "out"
    checkout.mkdir()
    (checkout / "run.py").write_text("")
    sweep = tmp_path / "s.yaml"
    sweep.write_text("dataset: digits\nmodel: mlp\nnum_clients: 4\nrounds: 2\nseeds: [0, 1]\n")
    argv = ["reference", "fake", str(sweep), "--checkout", str(checkout), "--output", str(out)]
    assert cli([*argv, "--reference-only", "--jobs", "2"]) == 1
    assert calls == {"clients": (checkout, out, {}), "checked": [0, 1], "run": ("fake", [7, 7], 2, 0)}
    text = capsys.readouterr().out
    assert (
        f"clients: {out / 'clients'}" in text
        and f"run it with: fedray sweep {out}/reference/fake-fedray.yaml" in text
    )
    side = (out / "reference" / "fake-fedray.yaml").read_text()
    assert f"each on the clients in {out / 'clients'}" in side and "num_clients: 7" in side
    assert "partition: file" not in side  # the runs as they are: on the record's clients
    assert cli([*argv, "--force"]) == 2 and "fake: --force does not apply" in capsys.readouterr().err
