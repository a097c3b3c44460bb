"""LEAF's JSON and the arrays fedray keeps beside it, as bad input: each a line naming the file (and
the user, the value), never a traceback; kept arrays used only where they were made from this
folder's JSON, and never able to run code."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

import fedray.data.leaf as leaf
from fedray.config.keys import ConfigError, file_digest
from fedray.data.leaf import FEMNIST, read_users
from tests.data.test_leaf import leaf_config, write_leaf


def _kept(root: Path) -> Path:
    (path,) = root.glob(".fedray-leaf-femnist-*.npz")
    return path


def _again(root: Path):
    leaf._READ.clear()  # a new process: what it kept is all it has
    return read_users(FEMNIST, root)


def test_arrays_kept_of_another_folders_json_are_not_used(tmp_path, capfd):
    mine = write_leaf(tmp_path / "mine", {"a": 4, "b": 3}, files=1)
    other = write_leaf(tmp_path / "other", {"x": 5, "y": 6, "z": 2}, files=1)
    read_users(FEMNIST, mine)
    read_users(FEMNIST, other)
    kept = _kept(mine)
    shutil.copyfile(_kept(other), kept)  # another folder's arrays, whole, under this folder's name
    users = _again(mine)
    assert users.names == ["a", "b"] and users.sizes().tolist() == [4, 3]  # this folder's JSON
    json_file = mine / "all_data" / "all_data_0.json"
    assert capfd.readouterr().err == (
        f"fedray: {kept}: they were made from other JSON than this folder's (all_data/all_data_0.json "
        "differs): reading the JSON again and keeping them anew\n"
    )
    with np.load(kept) as z:  # kept anew, recording the JSON they were made from
        assert z["json_files"].tolist() == ["all_data/all_data_0.json"]
        assert z["json_sha256"].tolist() == [file_digest(json_file)]
        assert z["names"].tolist() == ["a", "b"]
    assert _again(mine).names == ["a", "b"] and capfd.readouterr().err == ""  # and read back, silently
    # arrays of an older fedray, which did not record their JSON: read again too
    with np.load(kept) as z:
        np.savez(kept, **{k: z[k] for k in z.files if not k.startswith("json_")})
    assert _again(mine).names == ["a", "b"]
    assert (
        "they do not record the JSON they were made from (kept by an older fedray)" in capfd.readouterr().err
    )


class _Payload:
    """What a pickle may carry: a call made as it loads (here, creating ``marker``)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("how", ["npz", "pickle", "garbage", "offsets"])
def test_damaged_kept_arrays_run_no_code_and_are_made_anew_with_one_line(tmp_path, capfd, how):
    root = write_leaf(tmp_path / "femnist", {"a": 4, "b": 3}, files=1)
    first = read_users(FEMNIST, root)
    kept, marker = _kept(root), tmp_path / "ran"
    with np.load(kept) as z:
        arrays = {k: z[k] for k in z.files}
    if how == "npz":  # the arrays, the names an object array (a pickle inside the .npz)
        names = np.empty(1, dtype=object)
        names[0] = _Payload(marker)
        np.savez(kept, **(arrays | {"names": names}))
        with np.load(kept, allow_pickle=True) as z:  # what reading it with pickles would do
            z["names"]
        assert marker.exists()
        marker.unlink()
    elif how == "pickle":
        kept.write_bytes(pickle.dumps(_Payload(marker)))
    elif how == "garbage":
        kept.write_bytes(b"\x80\x04garbage")
    else:  # whole arrays that do not fit together: offsets past the samples
        np.savez(kept, **(arrays | {"offsets": arrays["offsets"] + 1}))
    users = _again(root)
    assert not marker.exists()
    assert (
        users.names == first.names and np.array_equal(users.x, first.x) and np.array_equal(users.y, first.y)
    )
    assert capfd.readouterr().err == (
        f"fedray: {kept} is not arrays fedray kept of this folder's LEAF JSON (damaged, or another file): "
        "reading the JSON again and keeping them anew\n"
    )
    with np.load(kept, allow_pickle=False) as z:  # made anew
        assert z["names"].tolist() == ["a", "b"] and z["offsets"].tolist() == [0, 4, 7]


def _spoil(root: Path, change) -> None:
    path = root / "all_data" / "all_data_0.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    "label, says",
    [
        (2**70, "1180591620717411303424"),
        (-(2**64), "-18446744073709551616"),
        (1e20, "1e+20"),
    ],
)
def test_a_label_past_any_class_id_is_one_line_naming_the_file_user_and_value(tmp_path, label, says):
    root = write_leaf(tmp_path / "femnist", {"a": 4, "b": 3}, files=1)
    _spoil(root, lambda d: d["user_data"]["b"]["y"].__setitem__(2, label))
    with pytest.raises(ConfigError) as e:
        leaf_config(tmp_path, root)
    path = root / "all_data" / "all_data_0.json"
    assert str(e.value) == f"{path}: user 'b': sample 2's label is {says}, too large for a class id"


def test_a_grey_level_past_a_float_is_one_line(tmp_path):
    root = write_leaf(tmp_path / "femnist", {"a": 4, "b": 3}, files=1)
    _spoil(root, lambda d: d["user_data"]["a"]["x"][1].__setitem__(3, 10**400))
    with pytest.raises(
        ConfigError, match=r"^\S+all_data_0\.json: user 'a': a FEMNIST sample is 784 grey levels"
    ):
        leaf_config(tmp_path, root)


def test_every_role_with_characters_outside_leafs_symbols_is_named_at_once(tmp_path):
    from tests.data.test_leaf_split import write_plays

    root = write_plays(tmp_path / "shakespeare", {f"R{i}": 90 for i in range(9)})
    path = root / "all_data" / "all_data.json"
    doc = json.loads(path.read_text())
    for i, char in ((1, "é"), (4, "’"), (5, "é"), (6, "\t"), (7, "é"), (8, "é"), (0, "ü")):
        x = doc["user_data"][f"R{i}"]["x"]
        x[3] = x[3][:10] + char + x[3][11:]
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError) as e:
        leaf_config(tmp_path, root, "shakespeare", train_fraction=0.1)
    assert str(e.value) == (
        "7 users' text holds characters that are not among LEAF's 80 symbols (ALL_LETTERS in its "
        f"models/utils/language_utils.py, which its models read): {path}: 'R0' ('ü'), 'R1' ('é'), 'R4' ('’'), "
        "'R5' ('é'), 'R6' ('\\t'), 'R7' ('é'); and 1 more"
    )
