"""A folder LEAF's own scripts split (train/ and test/): read as LEAF's training code reads it, its
Shakespeare gap and its cut role said as they are, and a test set that is the training set refused.

The folders are made here as LEAF's data/utils/sample.py (--niid) and split_data.py (--by_sample)
make them (TalwalkarLab/leaf @ 09ec454): `leaf_sample` and `leaf_split` follow their rules, and the
files they write were checked byte for byte against what those scripts wrote from the same
all_data/ (`LEAF_WROTE`: the SHA-256s of LEAF's output)."""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path

import numpy as np
import pytest

from fedray.config.keys import ConfigError
from fedray.data.leaf import FEMNIST, SHAKESPEARE, SHAKESPEARE_VOCAB, leaf_data
from tests.data.test_leaf import leaf_config, write_leaf

ROLES = {"HAMLET": 3000, "GHOST": 1000, "OPHELIA": 200, "YORICK": 120}


def role_text(name: str, n: int) -> str:
    """A role's text, ``n`` + 80 characters of LEAF's symbols drawn at random (no window repeats)."""
    rng = np.random.default_rng(int.from_bytes(name.encode(), "little") % 2**32)
    return "".join(rng.choice(list(SHAKESPEARE_VOCAB), n + 80))


def write_plays(root: Path, roles: dict[str, int] = ROLES) -> Path:
    """all_data/ as LEAF's Shakespeare preprocessing writes it: each role's windows sliding by one
    over its text (sample j: its text[j:j + 80], and text[j + 80] to predict), one file."""
    (root / "all_data").mkdir(parents=True)
    data: dict = {"users": list(roles), "num_samples": list(roles.values()), "user_data": {}}
    for name, n in roles.items():
        text = role_text(name, n)
        data["user_data"][name] = {"x": [text[j : j + 80] for j in range(n)], "y": list(text[80 : n + 80])}
    (root / "all_data" / "all_data.json").write_text(json.dumps(data))
    return root


def leaf_sample(data: dict, fraction: float, rng: random.Random) -> dict:
    """One all_data/ file as LEAF's sample.py --niid leaves it (files without 'hierarchies'): the
    users shuffled, taken whole while fewer than int(fraction x the file's samples) are taken; the
    last one cut to those still needed, its first ones in the order rng.sample draws."""
    users = list(data["users"])
    rng.shuffle(users)
    target = int(fraction * sum(data["num_samples"]))
    out: dict = {"users": [], "num_samples": [], "user_data": {}}
    taken = 0
    for user in users:
        if taken >= target:
            break
        own = data["user_data"][user]
        n = len(own["y"])
        if taken + n > target:
            n = target - taken
            order = rng.sample(range(n), n)
            own = {"x": [own["x"][i] for i in order], "y": [own["y"][i] for i in order]}
        out["users"].append(user)
        out["num_samples"].append(n)
        out["user_data"][user] = own
        taken += n
    return out


def leaf_split(data: dict, frac: float, rng: random.Random, name: str) -> tuple[dict, dict]:
    """One file as LEAF's split_data.py --by_sample splits it: a user of n >= 2 samples trains on
    max(1, int(frac n)) (1 of 2); Shakespeare's the first ones, its test samples from n_train + 79
    on, while its test count records n - n_train; else drawn with rng.sample, the rest its test
    ones; a user without a test sample left out."""
    train: dict = {"users": [], "num_samples": [], "user_data": {}}
    test: dict = {"users": [], "num_samples": [], "user_data": {}}
    for user in data["users"]:
        own = data["user_data"][user]
        n = len(own["y"])
        if n < 2:
            continue
        k = 1 if n == 2 else max(1, int(frac * n))
        if name == "shakespeare":
            train_at, test_at = set(range(k)), set(range(k + 79, n))
        else:
            train_at = set(rng.sample(range(n), k))
            test_at = set(range(n)) - train_at
        if not train_at or not test_at:
            continue
        for side, at, count in ((train, train_at, k), (test, test_at, n - k)):
            side["users"].append(user)
            side["num_samples"].append(count)
            side["user_data"][user] = {
                "x": [own["x"][j] for j in range(n) if j in at],
                "y": [own["y"][j] for j in range(n) if j in at],
            }
    return train, test


def write_leaf_split(
    root: Path,
    name: str,
    frac: float = 0.9,
    seed: int = 5,
    fraction: float | None = None,
    sample_seed: int = 3,
) -> Path:
    """train/ and test/ beside ``root``'s all_data/, as LEAF's preprocess.sh [-s niid --sf fraction
    --smplseed sample_seed] -t sample --tf frac --spltseed seed writes them (its file names too)."""
    sampler, splitter = random.Random(sample_seed), random.Random(seed)
    for side in ("train", "test"):
        (root / side).mkdir()
    for path in sorted((root / "all_data").glob("*.json")):
        data, stem = json.loads(path.read_text()), path.stem
        if fraction is not None:
            data, stem = leaf_sample(data, fraction, sampler), f"{stem}_niid_{str(fraction)[2:]}"
        for side, part in zip(("train", "test"), leaf_split(data, frac, splitter, name), strict=True):
            (root / side / f"{stem}_{side}_{str(frac)[2:]}.json").write_text(json.dumps(part))
    return root


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# The SHA-256s of the files LEAF's own split_data.py --name shakespeare --by_sample --frac 0.9
# --seed 5 wrote from `write_plays`' all_data/ (and, in the second, after its sample.py --niid
# --fraction 0.5 --seed 3): `write_leaf_split` writes the same bytes
LEAF_WROTE = {
    None: {
        "train/all_data_train_9.json": "8c9c53296b626baf69495c162bcb974404c64906096a5deabd6a294a5e389f58",
        "test/all_data_test_9.json": "fab0d6fd3db27d37ba4d2735fb9be82576e7268ba3d5f48b5a1a9187d193920d",
    },
    0.5: {
        "train/all_data_niid_5_train_9.json": "3dbb14ac5a925c297d36ff1e7c133c7603ba12c6119d26b29b4e08a8dcb98e24",
        "test/all_data_niid_5_test_9.json": "c59ab7e0967ab07211b340c1a278048b8603c46ab3bf9a1fafaf5cc827e45dc9",
    },
}


@pytest.mark.parametrize("fraction", [None, 0.5])
def test_the_split_made_here_is_the_one_leafs_scripts_write(tmp_path, fraction):
    root = write_leaf_split(write_plays(tmp_path / "shakespeare"), "shakespeare", fraction=fraction)
    assert {name: _sha256(root / name) for name in LEAF_WROTE[fraction]} == LEAF_WROTE[fraction]


def _text(data, rows) -> list[str]:
    return ["".join(SHAKESPEARE_VOCAB[i] for i in r) for r in data.dataset.train.x[rows]]


def _places(data, rows, text: str) -> np.ndarray:
    """Where each of ``rows``' windows starts in its role's ``text`` (random text: each window once)."""
    return np.array([text.index(w) for w in _text(data, rows)])


def test_a_shakespeare_folder_leaf_split_is_read_as_leafs_training_code_reads_it(tmp_path, capfd):
    root = write_leaf_split(write_plays(tmp_path / "shakespeare"), "shakespeare")
    # LEAF's split at --tf 0.9: HAMLET's 3,000 windows train on int(0.9 x 3000) = 2,700, its test
    # windows from 2,700 + 79 = 2,779 on: 221 of them, while its count says 3000 - 2700 = 300;
    # GHOST's 1,000: 900, and 21 from 979 (count 100); OPHELIA's 200 (180, tests from 259) and
    # YORICK's 120 (108, from 187) have none left, and are dropped
    test = json.loads((root / "test" / "all_data_test_9.json").read_text())
    assert test["users"] == ["HAMLET", "GHOST"] and test["num_samples"] == [300, 100]
    assert [len(test["user_data"][u]["y"]) for u in test["users"]] == [221, 21]
    cfg = leaf_config(tmp_path, root, "shakespeare")  # num_clients counted: the roles LEAF kept
    data = leaf_data(SHAKESPEARE, cfg)
    assert cfg.num_clients == 2
    assert [(len(c.train), len(c.test)) for c in data.clients.values()] == [(2700, 221), (900, 21)]
    hamlet = role_text("HAMLET", 3000)
    assert _text(data, data.clients[0].train) == [hamlet[j : j + 80] for j in range(2700)]
    assert _text(data, data.clients[0].test) == [hamlet[j : j + 80] for j in range(2779, 3000)]
    assert "share text" not in capfd.readouterr().err  # roles in order: LEAF's gap, nothing to say


@pytest.mark.parametrize(
    "side, user, count, said",
    [
        (
            "test",
            "HAMLET",
            299,
            r"user 'HAMLET' has 221 samples, and 'num_samples' says 299 \(or, LEAF's split",
        ),
        ("test", "GHOST", 101, r"user 'GHOST' has 21 samples, and 'num_samples' says 101"),
        ("train", "GHOST", 979, r"train_9\.json: user 'GHOST' has 900 samples, and 'num_samples' says 979$"),
    ],
)
def test_counts_other_than_leafs_split_writes_are_refused_naming_the_user(tmp_path, side, user, count, said):
    root = write_leaf_split(write_plays(tmp_path / "shakespeare"), "shakespeare")
    path = root / side / f"all_data_{side}_9.json"
    doc = json.loads(path.read_text())
    doc["num_samples"][doc["users"].index(user)] = count
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=said) as e:
        leaf_config(tmp_path, root, "shakespeare")
    assert "\n" not in str(e.value)


def test_a_femnist_test_count_79_short_is_not_leafs_and_is_refused(tmp_path):
    root = write_leaf(tmp_path / "femnist", {"a": 100, "b": 90}, files=1)
    write_leaf_split(root, "femnist")
    path = root / "test" / "all_data_0_test_9.json"
    doc = json.loads(path.read_text())
    assert doc["num_samples"] == [10, 9]  # FEMNIST's split writes what it counts
    doc["num_samples"][0] = 10 + 79
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"user 'a' has 10 samples, and 'num_samples' says 89$"):
        leaf_config(tmp_path, root)


def test_the_role_leafs_sampling_cuts_short_shares_text_and_is_said_once(tmp_path, capfd):
    # LEAF's --sf 0.5 of the file's 4,320 windows: 2,160, drawn by whole roles in a shuffled order;
    # YORICK's 120 came first (random.Random(3)), HAMLET's cut to the 2,040 still needed: its first
    # 2,040 windows in the order sample.py drew, split in that order: 1,836 train (int(0.9 x 2040)),
    # the test windows from 1,836 + 79 on (125), each a window of the first 2,040 drawn at random
    split = write_leaf_split(write_plays(tmp_path / "split"), "shakespeare", fraction=0.5)
    shutil.rmtree(split / "all_data")
    sampled = json.loads((split / "test" / "all_data_niid_5_test_9.json").read_text())
    assert sampled["users"] == ["HAMLET"] and sampled["num_samples"] == [2040 - 1836]
    whole = write_plays(tmp_path / "whole")
    hamlet = role_text("HAMLET", 3000)
    made = {}
    for name, root, keys in (
        ("split", split, {}),
        (
            "whole",
            whole,
            dict(sample_fraction=0.5, data_seed=3, split_seed=5),
        ),  # fedray's own sampling and split
    ):
        data = leaf_data(SHAKESPEARE, leaf_config(tmp_path, root, "shakespeare", **keys))
        ((c),) = data.clients.values()
        made[name] = (_text(data, c.train), _text(data, c.test))
        train, test = _places(data, c.train, hamlet), _places(data, c.test, hamlet)
        assert len(train) == 1836 and len(test) == 125 and max(train.max(), test.max()) == 2039
        # a test window shares text with a training one where one starts within 79 characters: by
        # brute force, every one of the 125 (the training windows are 90% of the first 2,040)
        assert sum(bool((np.abs(train - p) <= 79).any()) for p in test) == 125
        # 123 of them have a training window right beside them (one character on, or back)
        assert sum(bool(np.isin([p - 1, p + 1], train).any()) for p in test) == 123
        leaf_data(
            SHAKESPEARE, leaf_config(tmp_path, root, "shakespeare", **keys)
        )  # read again: not said again
    assert made["split"] == made["whole"]  # LEAF's scripts' clients, and fedray's of all_data/: the same
    err = capfd.readouterr().err
    # fedray made the split of all_data/: it knows where each window lies, and says all 125; from
    # LEAF's folder it finds them by their text, the windows that follow one another: at least 124
    # (one test window's nearest training ones lie past a window LEAF left out)
    whole_says = (
        f"{whole}: data.sample_fraction 0.5 cuts 1 role short as LEAF's sample.py does, storing the first "
        "samples it keeps shuffled, and its split_data.py splits that order: 125 of 125 test windows share "
        "text with a training window of their role (one starts fewer than 80 characters from them): 'HAMLET' "
        "125 of 125; every other role's test windows start 79 windows after its last training one (LEAF's gap)"
    )
    split_says = (
        f"{split}: 1 role's windows are not in their text's order (LEAF's sample.py stores the role it cuts "
        "short shuffled, and its split_data.py splits that order; found by their text): at least 124 of 125 "
        "test windows share text with a training window of their role"
    )
    assert err.count(whole_says) == 1 and err.count(split_says) == 1, err
    assert err.count("share text") == 2


def _femnist_split(tmp_path: Path) -> Path:
    """FEMNIST as LEAF splits it at --tf 0.9: a (100 samples) trains on 90 and tests on 10, b (90)
    on 81 and 9; all_data_1.json's one user, c, has one sample: dropped, both its files empty."""
    root = write_leaf(tmp_path / "femnist", {"a": 100, "c": 1, "b": 90}, files=2)
    return write_leaf_split(root, "femnist")


def test_a_test_file_that_is_a_training_file_is_refused_naming_both(tmp_path):
    root = _femnist_split(tmp_path)
    train, test = root / "train" / "all_data_0_train_9.json", root / "test" / "all_data_0_test_9.json"
    # LEAF writes a file of no user to both sides, byte for byte the same: read as it is
    empty = [root / side / f"all_data_1_{side}_9.json" for side in ("train", "test")]
    assert empty[0].read_bytes() == empty[1].read_bytes() and not json.loads(empty[0].read_text())["users"]
    data = leaf_data(FEMNIST, leaf_config(tmp_path, root))
    assert [(len(c.train), len(c.test)) for c in data.clients.values()] == [(90, 10), (81, 9)]
    shutil.copyfile(train, test)
    with pytest.raises(ConfigError) as e:
        leaf_config(tmp_path, root)
    assert str(e.value) == (
        f"{test} is byte for byte {train}: a test set that is the training set measures nothing; test/ "
        "holds each user's other samples (LEAF's preprocess.sh -t sample writes both)"
    )


@pytest.mark.parametrize("keys", ["hashed", "all equal"])
def test_a_test_set_inside_the_training_set_is_refused_and_a_few_shared_samples_are_counted(
    tmp_path, capfd, monkeypatch, keys
):
    if keys == "all equal":  # every sample's key the same: the samples themselves tell them apart
        import fedray.data.leaf as leaf

        monkeypatch.setattr(leaf, "_row_keys", lambda x, y, owner: np.zeros(len(x), np.uint64))
    root = _femnist_split(tmp_path)
    train, test = root / "train" / "all_data_0_train_9.json", root / "test" / "all_data_0_test_9.json"
    doc, tests = json.loads(train.read_text()), json.loads(test.read_text())
    # two of a's ten test samples made training samples of a, and one of b's: 3 of the 19
    for user, pairs in (("a", [(0, 4), (1, 7)]), ("b", [(8, 0)])):
        for t, i in pairs:
            for k in ("x", "y"):
                tests["user_data"][user][k][t] = doc["user_data"][user][k][i]
    # and one that is b's sample, shown as a's: another user's, not counted
    for k in ("x", "y"):
        tests["user_data"]["a"][k][9] = doc["user_data"]["b"][k][3]
    test.write_text(json.dumps(tests))
    data = leaf_data(FEMNIST, leaf_config(tmp_path, root))
    assert len(data.dataset.test) == 19
    err = capfd.readouterr().err
    assert (
        err.count(
            f"{root}: 3 of test/'s 19 samples are also training samples of their user (the same input and label; "
            "2 users, e.g. 'a'): LEAF's data holds them twice, and they count as test samples, as LEAF counts them"
        )
        == 1
    ), err
    # test/ as train/ holds it, written another way (not the same bytes): every test sample a training one
    test.write_text(json.dumps(doc, indent=1))
    with pytest.raises(
        ConfigError,
        match=rf"^{root}: every one of test/'s 171 samples is a training sample of its user \(the same input "
        r"and label\): a test set inside the training set measures nothing",
    ) as e:
        leaf_config(tmp_path, root)
    assert "\n" not in str(e.value)
