"""What several test files share: runs and their metrics, hand-made results, client functions
that run on actors, fake data files, the CLI."""

from __future__ import annotations

import gzip
import os
import re
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from analysis import load_metrics
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import execute
from fedray.records import TIMING_METRICS, rec
from fedray.storage.writer import ResultsWriter

TIMING = TIMING_METRICS  # metrics that measure time: never compared


def num_parameters(params) -> int:
    """The number of values in a parameter dict."""
    return int(sum(np.asarray(v).size for v in params.values()))


def encoder_params(params) -> dict:
    """The encoder's entries of a task model's parameters (names keep their ``encoder.`` prefix)."""
    return {k: v for k, v in params.items() if k.startswith("encoder.")}


def run_metrics(cfg):
    """Run ``cfg`` in-process; its metrics but the timings, sorted (round, metric, scope, entity)."""
    list(execute(cfg, make_local_federation))
    df = load_metrics(cfg.output)
    cols = ["round", "metric", "scope", "entity", "value"]
    return df[~df["metric"].isin(TIMING)].sort_values(cols[:4]).reset_index(drop=True)[cols]


METRIC_KEYS = ["run_id", "round", "stage", "metric", "scope", "entity"]


def stored_metrics(out) -> object:
    """A results folder's metrics but the timings, with run_id and stage, sorted by METRIC_KEYS."""
    df = load_metrics(out)
    df = df[~df["metric"].isin(TIMING)]
    return df.sort_values(METRIC_KEYS)[[*METRIC_KEYS, "value"]].reset_index(drop=True)


def round_metrics(out):
    """A results folder's metrics but the timings, without run_id and stage, sorted."""
    df = load_metrics(out)
    df = df[~df["metric"].isin(TIMING)]
    return df.sort_values(["round", "metric", "scope", "entity"])[
        ["round", "metric", "scope", "entity", "value"]
    ].reset_index(drop=True)


# Every algorithm but FedAvg (each test file runs FedAvg on its own terms), with small settings that exercise its state.
ALGORITHM_HP = {
    "clusterfedavg": {"num_clusters": 2},
    "fedconcat": {"num_clusters": 2, "encoder_rounds": 2},
    "fedconcat_id": {"num_clusters": 2, "encoder_rounds": 2, "random_inputs": 300},
    "fedprox": {"mu": 0.01},
    "scaffold": {},
    "fednova": {},
    "moon": {"mu": 1.0, "out_dim": 16},
    "fedrs": {"alpha": 0.5},
    "fedlc": {"tau": 1.0},
    "minibatch_sgd": {"fraction": 0.3},
    "fedcat": {"regroup_cycles": 1},
    "clusamp": {"similarity": "arccos"},
    "fedem": {"num_clusters": 2},
    "fedrc": {"num_clusters": 3, "adam": "paper", "delta": 0.2, "xi": 1.0, "finetune": True},
    "cfl": {"eps1": 10.0, "eps2": 0.0},  # splits whenever a cluster has more than two members
    "layercfl": {"eps1": 10.0, "eps2": 0.0, "layers": "fc", "distance": "delta_l2"},
    "ifca": {"num_clusters": 3, "persistent_optimizer": True},
    "fesem": {"num_clusters": 2, "persistent_optimizer": True},
    "fedsoft": {"num_clusters": 2, "tau": 2, "selection_size": 2},
}


# Config keys an algorithm needs changed from the test's (FedCat: K = 2 copies, 4 rounds = 2 cycles).
CONFIG_OVER = {
    "fedcat": {"participation": 0.34},
    "cfl": {"participation": 1.0},
    "layercfl": {"participation": 1.0},
    "minibatch_sgd": {"local_epochs": 1, "batch_size": 256},  # one step on a batch holding a client's split
}


FEDRAY = [sys.executable, "-m", "jobs.cli"]


def run(args, cwd, env=None, timeout=300):
    return subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )


def write_run(
    out,
    cfg: dict,
    rounds: dict[int, list],
    status: str = "finished",
    summary: dict | None = None,
    error: str = "RuntimeError: boom",
) -> str:
    """One run with the given records per round; ``cfg`` is a full config dict (edited freely)."""
    run_id = (
        f"{cfg['algorithm']}-{cfg['experiment']}-{cfg['partition']}{cfg['partition_k']}{cfg['partition_beta']}"
        f"-{sorted(cfg['hp'].items())}-lr{cfg['lr']}-s{cfg['seed']}"
    )
    if cfg.get("source", "fedray") != "fedray":  # a reference's run beside fedray's
        run_id += "-" + cfg["source"].replace("/", "_")
    if cfg.get("head_bias", True) is False:
        run_id += "-nobias"
    w = ResultsWriter(out, run_id, cfg, flush_every_s=0)
    w.start()
    for r, records in rounds.items():
        w.add(r, records)
    w.finish(summary or {}) if status == "finished" else w.fail(error)
    return run_id


def final(acc: float, rounds: int = 2) -> dict[int, list]:
    """A plain run: accuracy 0.1 at every round but the last, ``acc`` at the last."""
    return {
        r: [rec("accuracy", acc if r == rounds else 0.1), rec("train_accuracy", 0.5)]
        for r in range(1, rounds + 1)
    }


def count_calls(client, cstate, msg):
    n = (cstate or 0) + 1
    return {"cid": client.cid, "calls": n, "msg": msg}, n


def stamp_big(client, cstate, msg):
    """Relay client function: a carry of 1 MB stamped with the client's id; a small info."""
    carry, _ = msg
    out = np.array(carry, copy=True)
    out[client.cid] += 1
    return (out, int(out.sum())), cstate


def fail_from_two(client, cstate, msg):
    if client.cid >= 2:
        raise ValueError(f"bad batch of client {client.cid}")
    return None, cstate


def fail_on_three(client, cstate, msg):
    if client.cid == 3:
        raise ValueError("bad batch")
    return None, cstate


G = np.random.default_rng(0)


def write_idx(path: Path, arr: np.ndarray, gz: bool = False) -> None:
    header = struct.pack(">HBB", 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    data = header + arr.astype(np.uint8).tobytes()
    path.parent.mkdir(parents=True, exist_ok=True)
    if gz:
        with gzip.open(str(path) + ".gz", "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)


def mnist_like(root: Path, names: dict[str, str], n_train=50, n_test=20, classes=10, gz=False):
    xs = {"train": G.integers(0, 256, (n_train, 28, 28)), "test": G.integers(0, 256, (n_test, 28, 28))}
    ys = {"train": np.arange(n_train) % classes, "test": np.arange(n_test) % classes}
    for split in ("train", "test"):
        write_idx(root / names[f"{split}_x"], xs[split], gz)
        write_idx(root / names[f"{split}_y"], ys[split], gz)
    return xs, ys


FMNIST_NAMES = {
    "train_x": "train-images-idx3-ubyte",
    "train_y": "train-labels-idx1-ubyte",
    "test_x": "t10k-images-idx3-ubyte",
    "test_y": "t10k-labels-idx1-ubyte",
}


CHECK_NO_RAY = (
    "import sys; from jobs.cli import main; rc = main(sys.argv[1:]); "
    "assert 'ray' not in sys.modules, 'ray was imported'; sys.exit(rc)"
)

# Several `fedray` command lines in one fresh process (one interpreter start instead of one each):
# argv[1] is a JSON list of argument lists; prints a JSON list of [exit code, stderr], and fails if
# any of them imported Ray.
_CLIS_NO_RAY = """
import contextlib, io, json, sys
from jobs.cli import main
out = []
for args in json.loads(sys.argv[1]):
    got, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(got), contextlib.redirect_stderr(err):
        rc = main(args)
    out.append([rc, err.getvalue(), got.getvalue()])
    assert "ray" not in sys.modules, f"ray was imported by {args}"
print(json.dumps(out))
"""


def clis_without_ray(cases: list[list[str]], cwd, stdout: bool = False) -> list[tuple]:
    """Each command line's (exit code, stderr), or (exit code, stderr, stdout) with ``stdout``, all
    run in turn in one new process that never imports Ray (a process a command costs seconds)."""
    import json

    p = subprocess.run(
        [sys.executable, "-c", _CLIS_NO_RAY, json.dumps(cases)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return [tuple(r) if stdout else tuple(r[:2]) for r in json.loads(p.stdout.splitlines()[-1])]


SWEEP_BASE = """\
experiment: sw
dataset: synthetic
synthetic_size: 600
model: mlp
num_clients: 6
rounds: 2
local_epochs: 1
batch_size: 32
lr: 0.05
"""


def sweep_file(tmp_path: Path, body: str, name: str = "sweep.yaml") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    p = tmp_path / name
    body = textwrap.dedent(body)
    # a key the body sets replaces the base's line: fedray refuses a YAML key given twice
    own = set(re.findall(r"^([A-Za-z_][\w.]*):", body, flags=re.M))
    base = SWEEP_BASE + f"output: {tmp_path / 'out'}\n"
    kept = [line for line in base.splitlines(keepends=True) if line.split(":", 1)[0] not in own]
    p.write_text("".join(kept) + body)
    return p


def draw_borrowed_partition(c) -> list[np.ndarray]:
    """A partition file where a NIID-Bench-family harness leaves it, for the harnesses that borrow
    clients (FedRepo, FL-bench): four clients, two labels each."""
    from fedray.config.keys import partition_file_for
    from fedray.data import partition_file
    from fedray.data.datasets import train_labels
    from jobs.reference.harness import partition_template

    y, _ = train_labels(c)
    parts = [np.flatnonzero(np.isin(y, [2 * k, 2 * k + 1])) for k in range(4)]
    path = Path(partition_file_for(partition_template(Path(c.output), c), c.seed))
    partition_file.write_json(path, parts, len(y), dataset=c.dataset)
    return parts


def stop_after(cfg, rounds_done):
    """Run until round ``rounds_done``'s rows are written, then stop it as Ctrl-C would."""
    from fedray.experiment.loop import RoundDone
    from fedray.storage.results import run_state

    events = execute(cfg, make_local_federation)
    for ev in events:
        if isinstance(ev, RoundDone) and ev.round == rounds_done:
            break
    events.close()
    assert run_state(cfg.output, cfg.run_id()) == "interrupted"
