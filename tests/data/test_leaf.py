"""LEAF's FEMNIST and Shakespeare: their users are the clients, read from the JSON LEAF's scripts
write (small files made here: nothing downloads)."""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import pytest

from fedray.config.keys import ConfigError
from fedray.data.leaf import FEMNIST, SHAKESPEARE, SHAKESPEARE_VOCAB, LeafSettings, leaf_data, read_users
from fedray.experiment.checks import from_dict


def _femnist_user(rng: np.random.Generator, n: int) -> dict:
    grey = rng.integers(0, 256, size=(n, 784)) / 255  # LEAF writes 1 - pixel / 255: k / 255
    return {"x": grey.tolist(), "y": rng.integers(0, 62, n).tolist()}


def _shakespeare_user(rng: np.random.Generator, n: int) -> dict:
    pick = lambda k: "".join(rng.choice(list(SHAKESPEARE_VOCAB), k))  # noqa: E731
    return {"x": [pick(80) for _ in range(n)], "y": [pick(1) for _ in range(n)]}


def write_leaf(
    root: Path, sizes: dict[str, int], kind: str = "femnist", folder: str = "all_data", files: int = 2
) -> Path:
    """LEAF JSON as its scripts write it: the users spread over ``files`` files of ``folder``."""
    rng = np.random.default_rng(len(sizes))
    make = _femnist_user if kind == "femnist" else _shakespeare_user
    names = list(sizes)
    (root / folder).mkdir(parents=True, exist_ok=True)
    for f in range(files):
        mine = names[f::files]
        data = {
            "users": mine,
            "num_samples": [sizes[u] for u in mine],
            "user_data": {u: make(rng, sizes[u]) for u in mine},
        }
        (root / folder / f"{folder}_{f}.json").write_text(json.dumps(data))
    return root


def leaf_config(tmp_path, root, kind="femnist", **over):
    """A config of LEAF's ``kind`` on ``root``; a key of its own settings (data.NAME:
    sample_fraction, min_samples, train_fraction, split_seed) given by its name."""
    model = "leaf_cnn" if kind == "femnist" else "leaf_lstm"
    own = {f.name for f in dataclasses.fields(LeafSettings)}
    data = {k: v for k, v in over.items() if k in own}
    rest = {k: v for k, v in over.items() if k not in own}
    keys = {"dataset": kind, "data_root": str(root), "model": model, "output": str(tmp_path / "out")}
    return from_dict({**keys, **rest, "data": data})


def test_femnist_users_are_the_clients_split_by_sample_as_leaf_splits_them(tmp_path):
    root = write_leaf(tmp_path / "femnist", {"f_a": 10, "f_b": 2, "f_c": 1, "f_d": 5})
    with pytest.raises(
        ConfigError, match=r"config key 'num_clients': the femnist users of .* are 3; set num_clients: 3"
    ):
        leaf_config(tmp_path, root, num_clients=4)
    cfg = leaf_config(tmp_path, root, num_clients=3)
    data = leaf_data(FEMNIST, cfg)
    # a user needs two samples (f_c has one); it trains on max(1, int(0.9 n)) of them, one of two
    assert [(len(c.train), len(c.test)) for c in data.clients.values()] == [(9, 1), (1, 1), (4, 1)]
    assert len(data.dataset.test) == 3  # every user's test samples
    users = read_users(FEMNIST, root)
    assert users.names == ["f_a", "f_c", "f_b", "f_d"]  # in the files' order
    # the grey levels exactly, as uint8 read back by the data set's scale
    raw = json.loads((root / "all_data" / "all_data_0.json").read_text())["user_data"]["f_a"]
    x, y = data.dataset.train.x, data.dataset.train.y
    a = data.clients[0]
    got = sorted(map(tuple, x[np.concatenate([a.train, a.test])].reshape(10, 784)))
    want = sorted(map(tuple, np.rint(np.asarray(raw["x"]) * 255).astype(np.uint8)))
    assert got == want and sorted(y[np.concatenate([a.train, a.test])]) == sorted(raw["y"])
    assert data.dataset.spec.input_shape == (1, 28, 28) and data.dataset.spec.scale == 1 / 255

    # the split is the data seed's, not the run's: another seed trains on the same samples, another
    # data_seed draws other test samples
    def tests(d):
        return [d.dataset.train.x[d.clients[c].test].tobytes() for c in d.clients]

    assert tests(leaf_data(FEMNIST, leaf_config(tmp_path, root, num_clients=3))) == tests(data)
    assert tests(leaf_data(FEMNIST, leaf_config(tmp_path, root, num_clients=3, seed=4))) == tests(data)
    assert tests(leaf_data(FEMNIST, leaf_config(tmp_path, root, num_clients=3, data_seed=4))) != tests(data)


def test_leaf_min_samples_keeps_the_users_with_as_many_samples(tmp_path):
    root = write_leaf(tmp_path / "femnist", {f"u{i}": 2 + 3 * i for i in range(8)}, files=1)  # 2, 5, ..., 23
    cfg = leaf_config(tmp_path, root, num_clients=6, min_samples=6)  # 8, 11, ..., 23
    assert [len(c.train) + len(c.test) for c in leaf_data(FEMNIST, cfg).clients.values()] == [
        8,
        11,
        14,
        17,
        20,
        23,
    ]
    with pytest.raises(ConfigError, match=r"'data.train_fraction': must be"):
        leaf_config(tmp_path, root, num_clients=8, train_fraction=1.0)


def test_a_folder_leaf_split_already_is_read_as_split_and_its_keys_stay_leafs(tmp_path):
    root = tmp_path / "femnist"
    write_leaf(root, {"a": 6, "b": 3}, folder="train", files=1)
    write_leaf(root, {"a": 2, "b": 1}, folder="test", files=1)
    cfg = leaf_config(tmp_path, root, num_clients=2)
    data = leaf_data(FEMNIST, cfg)
    assert [(len(c.train), len(c.test)) for c in data.clients.values()] == [(6, 2), (3, 1)]
    with pytest.raises(ConfigError, match=r"'data.train_fraction': .* is split by LEAF already"):
        leaf_config(tmp_path, root, num_clients=2, train_fraction=0.8)


def test_shakespeare_is_next_character_prediction_split_in_order_as_leaf_splits_it(tmp_path):
    root = write_leaf(
        tmp_path / "shakespeare", {"HAMLET": 100, "OPHELIA": 92, "YORICK": 88}, kind="shakespeare"
    )
    cfg = leaf_config(tmp_path, root, "shakespeare", train_fraction=0.1)
    data = leaf_data(SHAKESPEARE, cfg)
    assert len(SHAKESPEARE_VOCAB) == 80 and data.dataset.spec.input_shape == (80,)
    raw = json.loads((root / "all_data" / "all_data_0.json").read_text())["user_data"]["HAMLET"]
    x, y = data.dataset.train.x, data.dataset.train.y
    text = lambda rows: ["".join(SHAKESPEARE_VOCAB[i] for i in r) for r in x[rows]]  # noqa: E731
    # HAMLET's first int(0.1 * 100) = 10 samples train; its test samples start 79 later (10 + 79 =
    # 89), so no test sample's 80 characters and next one overlap a training sample's
    assert text(data.clients[0].train) == raw["x"][:10] and text(data.clients[0].test) == raw["x"][89:]
    assert "".join(SHAKESPEARE_VOCAB[i] for i in y[data.clients[0].test]) == "".join(raw["y"][89:])
    # YORICK's 88: 8 train, and 8 + 79 = 87 leaves it one test sample (with 87 it would have none,
    # and be dropped as LEAF drops such a role: the next test)
    assert cfg.num_clients == 3 and [(len(c.train), len(c.test)) for c in data.clients.values()] == [
        (10, 11),
        (8, 1),
        (9, 4),
    ]
    bad = json.loads((root / "all_data" / "all_data_1.json").read_text())
    bad["user_data"]["OPHELIA"]["y"][0] = "é"
    (root / "all_data" / "all_data_1.json").write_text(json.dumps(bad))
    with pytest.raises(
        ConfigError, match=r"all_data_1\.json: user 'OPHELIA': character 'é' is not one of LEAF's 80 symbols"
    ):
        leaf_config(tmp_path, root, "shakespeare", train_fraction=0.1)


def test_what_is_read_is_kept_beside_the_json_and_read_back(tmp_path):
    import fedray.data.leaf as leaf

    root = write_leaf(tmp_path / "femnist", {"a": 4, "b": 3})
    first = read_users(FEMNIST, root)
    (kept,) = root.glob(".fedray-leaf-femnist-*.npz")
    leaf._READ.clear()
    again = read_users(FEMNIST, root)
    assert again.names == first.names and np.array_equal(again.x, first.x)
    (root / "all_data" / "all_data_0.json").touch()  # touched, not changed: the same arrays
    leaf._READ.clear()
    read_users(FEMNIST, root)
    assert list(root.glob(".fedray-leaf-femnist-*.npz")) == [kept]


def test_a_missing_folder_is_one_line_before_anything_runs(tmp_path):
    from tests.helpers import FEDRAY, run

    p = run(
        [*FEDRAY, "run", "--set", "dataset=femnist", "--set", f"data_root={tmp_path / 'none'}"], cwd=tmp_path
    )
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "no LEAF data in" in p.stderr and "all_data/*.json" in p.stderr and "preprocess.sh" in p.stderr


@pytest.mark.parametrize("kind", ["femnist", "shakespeare"])
def test_fedavg_runs_on_leafs_users_with_leafs_model(tmp_path, kind):
    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import Finished, execute

    sizes = {"a": 12, "b": 9, "c": 7} if kind == "femnist" else {"a": 100, "b": 95, "c": 92}
    root = write_leaf(tmp_path / kind, sizes, kind=kind)
    split = {} if kind == "femnist" else {"train_fraction": 0.1}  # the gap of 79 takes 80 samples
    # num_clients left out: fedray counts LEAF's users kept
    cfg = leaf_config(tmp_path, root, kind, rounds=2, batch_size=4, lr=0.05, **split)
    assert cfg.num_clients == 3
    events = list(execute(cfg, make_local_federation))
    assert isinstance(events[-1], Finished) and 0 <= events[-1].summary["final_accuracy"] <= 1
    assert events[-1].summary["batched_calls"] == 0
    # its partition is LEAF's users, named so in the summary, the result rows and the report
    from analysis.load import load_metrics, load_runs
    from analysis.report import partition_label

    assert events[-1].summary["partition_label"] == "leaf"
    assert set(load_metrics(cfg.output)["partition"]) == {"leaf"}
    runs = load_runs(cfg.output)
    assert set(runs["partition"]) == {"leaf"} and partition_label(runs["config"].iloc[0]) == "leaf"


def test_leafs_lstm_trains_one_client_at_a_time_and_on_refuses_it(tmp_path, capfd):
    from fedray.config import notes
    from fedray.engine import choice
    from fedray.models import build_model

    lstm = lambda: build_model("leaf_lstm", (80,), 80)  # noqa: E731
    auto = choice.choose("auto", "cuda", lstm)
    assert not auto.stacked and "LSTM" in auto.why
    # a host on a GPU under auto says once that it trains one client at a time, and why
    import dataclasses

    from fedray.data import ArrayDataset, DataSpec
    from fedray.engine.client import Task
    from fedray.federation.host import ClientHost

    task = Task(0, "leaf_lstm", DataSpec((80,), 80, 1.0), 1, 4, 0.1, 0.0, 0.0, 1.0, 8)
    data = ArrayDataset(np.zeros((4, 80), np.uint8), np.zeros(4, np.int64))
    host = ClientHost(dataclasses.replace(task, batched_clients="auto"), data, {})
    host.device = __import__("torch").device("cuda")  # as on a GPU (the decision only reads its type)
    notes._SAID.clear()
    assert not host.trains_batched() and not ClientHost(task, data, {}).trains_batched()
    host._engine = None
    assert not host.trains_batched()
    said = capfd.readouterr().err
    assert (
        said.count(
            "fedray: batched_clients auto trains one client at a time here: the model cannot train stacked: layer 'encoder.lstm' is LSTM"
        )
        == 1
    )
    root = write_leaf(tmp_path / "shakespeare", {"a": 100, "b": 95}, kind="shakespeare")
    with pytest.raises(
        ConfigError, match=r"'batched_clients': on: model leaf_lstm cannot train batched: layer .* is LSTM"
    ):
        leaf_config(tmp_path, root, "shakespeare", train_fraction=0.1, batched_clients="on")


def test_leafs_models_are_leafs(tmp_path):
    from fedray.models import build_model

    cnn = build_model("leaf_cnn", (1, 28, 28), 62)
    assert sum(p.numel() for p in cnn.parameters()) == 6_603_710  # LEAF's FEMNIST CNN
    lstm = build_model("leaf_lstm", (80,), 80)
    # embedding 8, two LSTM layers of 256, the head on the last step: LEAF's 817,872 and 2,048 more,
    # as PyTorch's LSTM keeps two bias vectors a layer where TensorFlow's cell keeps one (the same sums)
    assert sum(p.numel() for p in lstm.parameters()) == 819_920
    import torch

    assert lstm(torch.zeros(3, 80)).shape == (3, 80)


# --- all_data/ as LEAF's own scripts make it --------------------------------------------------------
# The expectations below are what LEAF's data/utils/sample.py, remove_users.py and split_data.py
# (TalwalkarLab/leaf @ 09ec454, run with python3 on the files `write_numbered` makes, visiting the
# files in sorted order) wrote into train/ and test/: each client as (user, its training samples,
# its test samples), a sample named by its position among its user's samples in all_data/.

NUMBERED = [
    {"w00": 3, "w01": 12, "w02": 7, "w03": 1, "w04": 25, "w05": 9},
    {"w06": 40, "w07": 2, "w08": 15, "w09": 6, "w10": 11},
]


def _numbered_text(u: int, n: int) -> str:
    return "".join(
        SHAKESPEARE_VOCAB[(u * 31 + k * 7 + (k * k) % 13 + (k // 80) * 3) % 80] for k in range(n + 80)
    )


def write_numbered(root: Path, kind: str) -> Path:
    """LEAF JSON whose samples say who they are: a FEMNIST sample's pixel 0 is its user's number /
    255 and pixel 1 its position / 255; a Shakespeare user's samples are the windows of one text
    sliding by one (40 times as many samples a user), sample j its text[j:j + 80] and text[j + 80]."""
    (root / "all_data").mkdir(parents=True)
    for f, sizes in enumerate(NUMBERED):
        data = {"users": list(sizes), "num_samples": [], "user_data": {}}
        for name, n in sizes.items():
            u = int(name[1:])
            if kind == "femnist":
                xs = [[u / 255, j / 255] + [0.0] * 782 for j in range(n)]
                ys = [(u * 7 + j) % 62 for j in range(n)]
            else:
                n *= 40
                text = _numbered_text(u, n)
                xs, ys = [text[j : j + 80] for j in range(n)], [text[j + 80] for j in range(n)]
            data["num_samples"].append(n)
            data["user_data"][name] = {"x": xs, "y": ys}
        (root / "all_data" / f"all_data_{f}.json").write_text(json.dumps(data))
    return root


def _text_positions(x: np.ndarray, text: str, rows: np.ndarray) -> list[int]:
    """Where each of ``rows``' 80 characters start in its user's ``text``: the sample's position."""
    return [text.index("".join(SHAKESPEARE_VOCAB[i] for i in r)) for r in x[rows]]


def numbered_clients(kind: str, cfg) -> list[tuple[str, list[int], list[int]]]:
    """The run's clients as (user, its training samples, its test samples), samples by position."""
    data = leaf_data(FEMNIST if kind == "femnist" else SHAKESPEARE, cfg)
    x = data.dataset.train.x
    out = []
    for c in data.clients.values():
        if kind == "femnist":
            user = int(x[c.train[0]].reshape(-1)[0])
            pos = lambda rows: [int(v) for v in x[rows].reshape(len(rows), -1)[:, 1]]  # noqa: E731
        else:
            first = "".join(SHAKESPEARE_VOCAB[i] for i in x[c.train[0]])
            user = next(
                u for f in NUMBERED for u in map(lambda n: int(n[1:]), f) if first in _numbered_text(u, 2000)
            )
            pos = functools.partial(_text_positions, x, _numbered_text(user, 2000))
        out.append((f"w{user:02d}", pos(c.train), pos(c.test)))
    return out


# preprocess.sh -s niid --sf 0.5 -k 4 -t sample --tf 0.8 --smplseed 7 --spltseed 11
FEMNIST_SAMPLED = [
    ("w04", [0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 14, 15, 16, 17, 18, 20, 22, 24], [3, 13, 19, 21, 23]),
    ("w08", [0, 2, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14], [1, 3, 8]),
    ("w09", [0, 1, 4, 5], [2, 3]),
    ("w10", [0, 1, 3, 4, 5, 7, 8, 9], [2, 6, 10]),
]
# preprocess.sh -k 10 -t sample --tf 0.9 --spltseed 5 (no sampling)
FEMNIST_KEPT = [
    ("w01", [0, 1, 3, 4, 5, 6, 7, 8, 9, 11], [2, 10]),
    ("w04", [0, 1, 2, 3, 4, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 19, 20, 21, 22, 23, 24], [5, 8, 18]),
    ("w06", [*range(16), *range(17, 24), 25, 26, 27, *range(29, 34), *range(35, 40)], [16, 24, 28, 34]),
    ("w08", [0, 1, 2, 3, 4, 5, 6, 8, 9, 11, 12, 13, 14], [7, 10]),
    ("w10", [0, 1, 2, 3, 4, 6, 7, 8, 9], [5, 10]),
]
# preprocess.sh -s niid --sf 0.3 -t sample --tf 0.75 --smplseed 2 --spltseed 9: w01 and w06 are cut
# short, their first samples in the order sample.py drew them
FEMNIST_CUT = [
    ("w02", [0, 2, 3, 4, 5], [1, 6]),
    ("w01", [4, 7, 1, 6, 3, 5], [8, 0, 2]),
    ("w06", [16, 8, 1, 0, 11, 14, 10, 20, 2, 17, 3, 19, 12, 9, 5, 7], [21, 6, 13, 15, 18, 4]),
]


@pytest.mark.parametrize(
    "keys, want",
    [
        (
            dict(
                sample_fraction=0.5,
                min_samples=4,
                train_fraction=0.8,
                data_seed=7,
                split_seed=11,
            ),
            FEMNIST_SAMPLED,
        ),
        (dict(min_samples=10, data_seed=3, split_seed=5), FEMNIST_KEPT),
        (
            dict(sample_fraction=0.3, train_fraction=0.75, data_seed=2, split_seed=9),
            FEMNIST_CUT,
        ),
    ],
)
def test_femnist_from_all_data_is_what_leafs_scripts_make(tmp_path, keys, want):
    root = write_numbered(tmp_path / "femnist", "femnist")
    cfg = leaf_config(tmp_path, root, **keys)  # num_clients left out: the users LEAF keeps
    assert cfg.num_clients == len(want)
    assert numbered_clients("femnist", cfg) == want


# Shakespeare (users of 40 x NUMBERED's samples): LEAF's in-order split, each client as (user,
# training samples, test samples, its first four training samples, its first three test samples)
SHAKESPEARE_CASES = [
    # preprocess.sh -s niid --sf 0.6 -k 3 -t sample --tf 0.9 --smplseed 4 --spltseed 8: w04 is cut
    # to 889 samples in sample.py's order, and split in that order
    (
        dict(sample_fraction=0.6, min_samples=3, data_seed=4, split_seed=8),
        [
            ("w04", 871, 18, [490, 158, 92, 68], [791, 388, 742]),
            ("w06", 1440, 81, [0, 1, 2, 3], [1519, 1520, 1521]),
        ],
    ),
    # preprocess.sh -t sample --tf 0.9: every role of 800 samples or fewer has no test sample left
    (
        dict(),
        [
            ("w04", 900, 21, [0, 1, 2, 3], [979, 980, 981]),
            ("w06", 1440, 81, [0, 1, 2, 3], [1519, 1520, 1521]),
        ],
    ),
]


@pytest.mark.parametrize("keys, want", SHAKESPEARE_CASES)
def test_shakespeare_from_all_data_is_what_leafs_scripts_make(tmp_path, keys, want):
    root = write_numbered(tmp_path / "shakespeare", "shakespeare")
    cfg = leaf_config(tmp_path, root, "shakespeare", **keys)
    got = [(u, len(tr), len(te), tr[:4], te[:3]) for u, tr, te in numbered_clients("shakespeare", cfg)]
    assert cfg.num_clients == len(want) and got == want


def test_leaf_user_fraction_is_retired_naming_leafs_sampling(tmp_path):
    root = write_leaf(tmp_path / "femnist", {"a": 4, "b": 3})
    with pytest.raises(
        ConfigError, match=r"'leaf_user_fraction' is retired: .*data.sample_fraction is LEAF's --sf"
    ):
        leaf_config(tmp_path, root, leaf_user_fraction=0.5)


def test_clients_are_counted_and_clients_per_round_is_leafs_clients_a_round(tmp_path):
    root = write_leaf(tmp_path / "femnist", {f"u{i}": 5 + i for i in range(7)}, files=1)
    cfg = leaf_config(tmp_path, root, clients_per_round=3)
    assert cfg.num_clients == 7 and cfg.participation == 3 / 7
    from fedray.federation import participants

    assert participants(cfg.num_clients, cfg.participation) == 3
    with pytest.raises(
        ConfigError, match=r"'num_clients': the femnist users .* are 7; set num_clients: 7, or leave it out"
    ):
        leaf_config(tmp_path, root, num_clients=6)
    with pytest.raises(
        ConfigError,
        match=r"'clients_per_round': 3 clients a round, and participation 0.6 gives 4 of 7: set one of them",
    ):
        leaf_config(tmp_path, root, clients_per_round=3, participation=0.6)
    with pytest.raises(
        ConfigError, match=r"'clients_per_round': 9 clients a round, but the run has 7 clients"
    ):
        leaf_config(tmp_path, root, clients_per_round=9)
    # the resolved config (num_clients and participation written out) loads as the same run
    from fedray.experiment.checks import from_dict as again

    assert again(cfg.to_dict()).run_id() == cfg.run_id()


def test_the_kept_arrays_follow_the_jsons_content(tmp_path, capfd):
    import os

    import fedray.data.leaf as leaf

    root = write_leaf(tmp_path / "femnist", {"a": 4, "b": 3}, files=1)
    path = root / "all_data" / "all_data_0.json"
    first = read_users(FEMNIST, root)
    (kept,) = root.glob(".fedray-leaf-femnist-*.npz")
    assert kept.stat().st_mode & 0o777 == 0o666 & ~_umask()  # as the user's other files
    # one label changed, the file's size and modification time as they were: read anew
    st = path.stat()
    data = json.loads(path.read_text())
    data["user_data"]["a"]["y"][0] = (data["user_data"]["a"]["y"][0] + 1) % 10
    path.write_text(json.dumps(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    leaf._READ.clear()
    changed = read_users(FEMNIST, root)
    assert changed.y[0] == (first.y[0] + 1) % 10
    (now,) = root.glob(".fedray-leaf-femnist-*.npz")  # the old arrays removed
    assert now != kept
    # damaged arrays: the JSON read again, said once, the arrays written anew
    now.write_bytes(b"not an npz")
    leaf._READ.clear()
    assert np.array_equal(read_users(FEMNIST, root).y, changed.y)
    assert capfd.readouterr().err == (
        f"fedray: {now} is not arrays fedray kept of this folder's LEAF JSON (damaged, or another file): "
        "reading the JSON again and keeping them anew\n"
    )
    assert np.load(now)["y"].tolist() == changed.y.tolist()


def test_a_folder_that_cannot_keep_the_arrays_is_read_from_its_json_with_one_note(
    tmp_path, capfd, monkeypatch
):
    import tempfile

    root = write_leaf(tmp_path / "femnist", {"a": 4, "b": 3}, files=1)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    users = read_users(FEMNIST, root)
    assert users.names == ["a", "b"] and not list(root.glob(".fedray-leaf-*"))
    err = capfd.readouterr().err
    assert err.count("cannot keep the arrays read from its LEAF JSON (Permission denied)") == 1


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def _spoil(root: Path, name: str, change) -> None:
    path = root / "all_data" / name
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda d: d["user_data"]["a"]["x"][1].__setitem__(5, None),
            r"all_data_0\.json: user 'a': sample 1 has a null or non-finite grey level",
        ),
        (
            lambda d: d["user_data"]["a"]["x"][0].__setitem__(0, float("nan")),
            r"user 'a': sample 0 has a null or non-finite grey level",
        ),
        (
            lambda d: d["user_data"]["a"]["y"].__setitem__(2, 3.7),
            r"user 'a': sample 2's label is 3\.7, not a class id",
        ),
        (
            lambda d: d["user_data"]["a"]["y"].__setitem__(0, "3.5"),
            r"user 'a': sample 0's label is '3\.5', not a class id",
        ),
        (
            lambda d: d["user_data"]["a"]["y"].__setitem__(0, None),
            r"user 'a': sample 0's label is None, not a class id",
        ),
        (
            lambda d: d.update(users=[["a"]], num_samples=[4]),
            r"all_data_0\.json: 'users' holds \['a'\], not a user's name",
        ),
        (
            lambda d: d.update(users=[*d["users"], "a"], num_samples=[*d["num_samples"], 4]),
            r"all_data_0\.json: user 'a' is listed twice \(here\)",
        ),
    ],
)
def test_a_leaf_file_that_would_change_numbers_silently_is_refused_naming_it(tmp_path, change, message):
    root = write_leaf(tmp_path / "femnist", {"a": 4, "b": 3}, files=1)
    _spoil(root, "all_data_0.json", change)
    with pytest.raises(ConfigError, match=message) as e:
        leaf_config(tmp_path, root)
    assert "\n" not in str(e.value)


def test_a_user_in_two_files_a_deep_nest_and_a_split_without_training_samples_are_refused(tmp_path):
    root = write_leaf(tmp_path / "two", {"a": 4, "b": 3}, files=2)
    _spoil(
        root,
        "all_data_1.json",
        lambda d: d.update(
            users=["b", "a"], num_samples=[3, 4], user_data={**d["user_data"], "a": d["user_data"]["b"] | {}}
        ),
    )
    with pytest.raises(
        ConfigError, match=r"all_data_1\.json: user 'a' is listed twice \(here and in .*all_data_0\.json\)"
    ):
        leaf_config(tmp_path, root)
    deep = tmp_path / "deep"
    (deep / "all_data").mkdir(parents=True)
    (deep / "all_data" / "all_data_0.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(
        ConfigError, match=r"all_data_0\.json: not LEAF JSON \(nested deeper than Python reads\)"
    ):
        leaf_config(tmp_path, deep)
    split = tmp_path / "split"
    write_leaf(split, {"a": 6, "b": 3}, folder="train", files=1)
    write_leaf(split, {"a": 2, "b": 1}, folder="test", files=1)
    _train = split / "train" / "train_0.json"
    data = json.loads(_train.read_text())
    data["user_data"]["b"] = {"x": [], "y": []}
    data["num_samples"][data["users"].index("b")] = 0
    _train.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"train/'s user 'b' has no training sample"):
        leaf_config(tmp_path, split)


def test_train_and_test_listing_the_users_in_another_order_pair_each_users_own(tmp_path):
    root = tmp_path / "femnist"
    write_leaf(root, {"a": 6, "b": 3}, folder="train", files=1)
    write_leaf(root, {"a": 2, "b": 1}, folder="test", files=1)
    test = root / "test" / "test_0.json"
    data = json.loads(test.read_text())
    data["users"] = list(reversed(data["users"]))
    data["num_samples"] = list(reversed(data["num_samples"]))
    test.write_text(json.dumps(data))
    data = leaf_data(FEMNIST, leaf_config(tmp_path, root))
    assert [(len(c.train), len(c.test)) for c in data.clients.values()] == [(6, 2), (3, 1)]
