"""The results folder: docs/output.md#output columns, atomic files, no duplicate rows after a restart."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis import load_metrics, load_runs
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import execute
from fedray.records import rec
from fedray.storage.results import run_status
from fedray.storage.writer import ResultsWriter
from tests.conftest import ROOT, small_config

DESIGN_COLUMNS = {
    "run_id",
    "experiment",
    "algorithm",
    "dataset",
    "partition",
    "seed",
    "round",
    "stage",
    "scope",
    "entity",
    "metric",
    "value",
}


def test_run_writes_design_columns_runs_row_and_config(tmp_path):
    cfg = small_config(tmp_path, rounds=2, client_test_fraction=0.2)
    list(execute(cfg, make_local_federation))
    df = pd.read_parquet(tmp_path / "out" / "metrics")  # the public contract: plain pandas
    assert DESIGN_COLUMNS <= set(df.columns)
    assert set(df["round"]) == {1, 2}
    glob = df[df["scope"] == "global"]
    assert {
        "accuracy",
        "loss",
        "local_accuracy",
        "train_accuracy",
        "bytes_down",
        "bytes_up",
        "seconds",
    } <= set(glob["metric"])
    assert (glob["entity"] == -1).all()
    clients = df[(df["scope"] == "client") & (df["metric"] == "local_accuracy")]
    assert sorted(clients["entity"].unique()) == list(range(6))
    runs = load_runs(tmp_path / "out")
    assert runs["status"].tolist() == ["finished"]
    assert runs["config"][0]["num_clients"] == 6 and "torch" in runs["versions"][0]
    assert (
        runs["summary"][0]["final_accuracy"]
        == glob[(glob["metric"] == "accuracy") & (glob["round"] == 2)]["value"].item()
    )
    assert (tmp_path / "out" / "configs" / f"{cfg.run_id()}.yaml").is_file()


def test_rerun_of_same_run_id_leaves_no_duplicate_rows(tmp_path):
    cfg = small_config(tmp_path, rounds=2)
    list(execute(cfg, make_local_federation))
    first = load_metrics(cfg.output)
    list(execute(cfg, make_local_federation))
    again = load_metrics(cfg.output)
    assert len(again) == len(first)
    cols = ["round", "metric", "scope", "entity"]
    assert not again.duplicated(cols).any()


def test_a_run_started_again_leaves_a_run_whose_id_extends_its_own_alone(tmp_path):
    # `fedray reference` imports the reference's run as RUN_ID-ref beside fedray's RUN_ID: fedray's
    # run starting (again) clears its own rows, not the reference's, and a resume truncates only its own
    def write(run_id, rounds, keep_through=None):
        config = {
            "experiment": "e",
            "algorithm": "fedavg",
            "dataset": "digits",
            "partition": "iid",
            "model": "mlp",
            "seed": 0,
            "num_clients": 1,
            "rounds": 3,
        }
        w = ResultsWriter(tmp_path, run_id, config)
        w.start(keep_through)
        for r in rounds:
            w.add(r, [rec("accuracy", r / 10)])
            w.flush()
        w.write_clients([{"client": 0, "role": "train"}])
        w.finish({})

    write("r-ref", [1, 2, 3])
    write("r", [1, 2, 3])
    write("r", [1, 2])
    write("r", [3], keep_through=1)
    m = load_metrics(tmp_path)
    by_run = {rid: sorted(g["round"]) for rid, g in m[m["metric"] == "accuracy"].groupby("run_id")}
    assert by_run == {"r": [1, 3], "r-ref": [1, 2, 3]}
    assert (tmp_path / "clients" / "r-ref-clients.parquet").is_file()


def test_failed_run_is_recorded(tmp_path):
    cfg = small_config(tmp_path, rounds=2)

    def broken_factory(cfg, data):
        raise RuntimeError("no federation today")

    try:
        list(execute(cfg, broken_factory))
    except RuntimeError:
        pass
    runs = load_runs(cfg.output)
    assert runs["status"].tolist() == ["failed"]
    assert "RuntimeError: no federation today" in runs["error"][0]
    assert run_status(cfg.output, cfg.run_id()) == "failed"


def test_leftover_temporary_files_are_ignored(tmp_path):
    w = ResultsWriter(tmp_path, "r1", small_config(tmp_path).to_dict(), flush_every_s=0)
    w.start()
    w.add(1, [rec("accuracy", 0.5)])
    # What a kill during a write leaves behind: half-written hidden files.
    (tmp_path / "metrics" / ".r1-000001.parquet.abcd1234.tmp").write_bytes(b"PAR1\x00garbage")
    (tmp_path / "runs" / ".r1.parquet.ffff0000.tmp").write_bytes(b"")
    df = pd.read_parquet(tmp_path / "metrics")
    assert df["value"].tolist() == [0.5]
    assert load_runs(tmp_path)["status"].tolist() == ["running"]


WRITER_LOOP = """
import sys
from fedray.records import rec
from fedray.storage.writer import ResultsWriter
from tests.conftest import small_config
out = sys.argv[1]
w = ResultsWriter(out, "loop", small_config(__import__("pathlib").Path(out)).to_dict(), flush_every_s=0)
w.start()
print("started", flush=True)
r = 0
while True:
    r += 1
    w.add(r, [rec("accuracy", r / 1000.0, scope="client", entity=e) for e in range(2000)])
"""


def test_killed_mid_write_results_still_load(tmp_path):
    """SIGKILL a writer that flushes 2,000 rows at a time back to back, each flush rewriting its
    growing part file; every visible file is whole, holding whole flushes."""
    p = subprocess.Popen(
        [sys.executable, "-c", WRITER_LOOP, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 60
    part = tmp_path / "metrics" / "loop-000000.parquet"
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, pa.ArrowException):  # not there yet
            if pq.read_metadata(part).num_rows >= 10 * 2000:
                break
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    df = load_metrics(tmp_path)
    assert len(df) >= 10 * 2000  # only complete files, of whole flushes
    for f in (tmp_path / "metrics").glob("*.parquet"):
        assert pq.read_metadata(f).num_rows % 2000 == 0
    assert sorted(set(df["round"])) == list(range(1, len(df) // 2000 + 1))
    assert not df.duplicated(["round", "entity"]).any()
    assert load_runs(tmp_path)["status"].tolist() == ["interrupted"]  # never finished, its writer is gone


def test_flushes_grow_a_part_file_until_it_holds_part_rows_and_a_resume_truncates_across_parts(
    tmp_path, monkeypatch
):
    # A run flushing every 10 s for days once left a part file per flush, which every reader opens.
    from analysis import load_assignments
    from fedray.records import assignment_rec
    from fedray.storage import writer

    monkeypatch.setattr(writer, "PART_ROWS", 5)
    cfg = small_config(tmp_path).to_dict()
    w = ResultsWriter(tmp_path, "r", cfg, flush_every_s=0)
    w.start()
    for r in range(1, 13):  # two metric rows a round, each round one flush; one assignment row
        w.add(r, [rec("accuracy", r / 100), rec("loss", r), assignment_rec(0, r % 2)])
    parts = sorted(p.name for p in (tmp_path / "metrics").glob("*.parquet"))
    assert parts == [f"r-{i:06d}.parquet" for i in range(4)]  # 6 rows each: closed at >= 5
    assert [pq.read_metadata(tmp_path / "metrics" / p).num_rows for p in parts] == [6, 6, 6, 6]
    assert len(list((tmp_path / "assignments").glob("*.parquet"))) == 4  # closed with the metrics
    m = load_metrics(tmp_path)
    assert m[m["metric"] == "loss"]["value"].tolist() == list(range(1, 13))
    w.release()

    # Resumed from a checkpoint after round 7: rounds 8-12 go, from inside a part and whole parts.
    again = ResultsWriter(tmp_path, "r", cfg, flush_every_s=0)
    again.start(keep_through=7)
    again.add(8, [rec("accuracy", 0.99), rec("loss", 80.0), assignment_rec(0, 0)])
    again.finish({})
    parts = sorted(p.name for p in (tmp_path / "metrics").glob("*.parquet"))
    assert parts == ["r-000000.parquet", "r-000001.parquet", "r-000002.parquet", "r-000004.parquet"]
    m = load_metrics(tmp_path)
    assert m[m["metric"] == "loss"]["value"].tolist() == [1, 2, 3, 4, 5, 6, 7, 80]
    assert load_assignments(tmp_path)["round"].tolist() == [*range(1, 9)]


def test_a_run_stopped_midway_is_recorded_as_interrupted(tmp_path):
    cfg = small_config(tmp_path, rounds=5)
    events = execute(cfg, make_local_federation)
    for ev in events:
        if getattr(ev, "round", 0) == 2:
            break
    events.close()  # what the coordinator sees when the driver goes away
    runs = load_runs(cfg.output)
    assert runs["status"].tolist() == ["interrupted"]
    assert runs["error"][0] == "interrupted after 2 of 5 rounds"  # both rounds it saw were complete
    assert set(load_metrics(cfg.output)["round"]) == {1, 2}


def test_assignment_rows_go_to_their_own_table_and_a_rerun_leaves_no_duplicates(tmp_path):
    from analysis import load_assignments
    from fedray.records import assignment_rec

    cfg = small_config(tmp_path).to_dict()
    for _ in range(2):  # the second attempt of the same run id replaces the first
        w = ResultsWriter(tmp_path, "r1", cfg, flush_every_s=0)
        w.start()
        w.add(0, [assignment_rec(0, 1), assignment_rec(1, 0), rec("accuracy", 0.5)])
        w.add(
            3,
            [assignment_rec(0, 0, weight=0.25, stage="enc"), assignment_rec(0, 1, weight=0.75, stage="enc")],
        )
        w.finish({})
    a = load_assignments(tmp_path)
    assert a[["round", "client", "cluster", "weight", "stage"]].values.tolist() == [
        [0, 0, 1, 1.0, ""],
        [0, 1, 0, 1.0, ""],
        [3, 0, 0, 0.25, "enc"],
        [3, 0, 1, 0.75, "enc"],
    ]
    assert set(a["run_id"]) == {"r1"} and set(a["algorithm"]) == {"fedavg"}
    assert load_metrics(tmp_path)["metric"].tolist() == ["accuracy"]  # no assignment leaked into metrics


def _writer(tmp_path, run_id="r"):
    return ResultsWriter(tmp_path / "out", run_id, small_config(tmp_path).to_dict(), flush_every_s=0)


def test_a_finished_or_failed_run_leaves_no_lock_file_behind(tmp_path):
    w = _writer(tmp_path)
    w.start()
    lock = tmp_path / "out" / "runs" / ".r.lock"
    assert lock.read_text().strip() == str(os.getpid())  # held, with its owner's pid
    w.finish({})
    assert not lock.exists() and run_status(tmp_path / "out", "r") == "finished"
    failed = _writer(tmp_path, "f")
    failed.start()
    failed.fail("RuntimeError: x")
    assert not (tmp_path / "out" / "runs" / ".f.lock").exists()


def test_a_link_planted_at_the_lock_path_is_refused_and_its_target_left_whole(tmp_path):
    # Run ids are predictable: a symbolic or hard link at runs/.RUN_ID.lock once made the writer
    # truncate the file it points to.
    from fedray.storage.lock import UnsafeLockFile
    from fedray.storage.results import run_state

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    runs = tmp_path / "out" / "runs"
    runs.mkdir(parents=True)
    for plant, says in ((os.symlink, "symbolic link"), (os.link, "hard link")):
        (runs / ".r.lock").unlink(missing_ok=True)
        plant(victim, runs / ".r.lock")
        with pytest.raises(UnsafeLockFile, match=rf"\.r\.lock is .*{says}.*remove"):
            _writer(tmp_path).start()
        assert victim.read_text() == "precious\n"
        assert run_state(tmp_path / "out", "r") == "new"  # a probe neither follows nor fails


def _unblocked(fn):
    """``fn()``'s value, or its error raised here, failing the test if it is still running after 20
    s (a FIFO opened for reading waits for a writer that never comes)."""
    import threading

    ended: list = []

    def call() -> None:
        try:
            ended.append((fn(), None))
        except BaseException as e:  # noqa: BLE001 - raised in the test below
            ended.append((None, e))

    probe = threading.Thread(target=call, daemon=True)
    probe.start()
    probe.join(timeout=20)
    assert not probe.is_alive(), "opening the FIFO blocked"
    value, error = ended[0]
    if error is not None:
        raise error
    return value


def test_a_fifo_at_the_lock_path_neither_hangs_a_report_nor_a_writer(tmp_path):
    from fedray.storage.lock import UnsafeLockFile
    from fedray.storage.results import run_state

    runs = tmp_path / "out" / "runs"
    runs.mkdir(parents=True)
    os.mkfifo(runs / ".r.lock")
    _writer(tmp_path, "r")._write_run("running")  # a run whose writer is gone
    assert _unblocked(lambda: run_state(tmp_path / "out", "r")) == "interrupted"
    with pytest.raises(UnsafeLockFile, match="not a regular file"):
        _writer(tmp_path).start()


def test_every_bit_flipped_in_a_metrics_files_values_is_caught_naming_the_file(tmp_path, capsys):
    # Results carry page checksums (CRC-32): a flipped bit in the stored values is an error that
    # names the damaged file, never a changed number in `fedray report` (83 of 174 flips were, before).
    from fedray.storage.files import DamagedResults

    cfg = small_config(tmp_path, rounds=2)
    list(execute(cfg, make_local_federation))
    part = sorted((tmp_path / "out" / "metrics").glob("*.parquet"))[0]
    good = part.read_bytes()
    want = load_metrics(tmp_path / "out")
    meta = pq.ParquetFile(part).metadata
    col = meta.schema.names.index("value")
    chunk = meta.row_group(0).column(col)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    silent, caught = 0, 0
    for offset in range(start, start + chunk.total_compressed_size):  # one bit a byte, in turn
        bad = bytearray(good)
        bad[offset] ^= 1 << (offset % 8)
        part.write_bytes(bytes(bad))
        try:
            got = load_metrics(tmp_path / "out")
        except DamagedResults as e:
            assert part.name in str(e)
            caught += 1
            continue
        silent += not got.equals(want)
    assert silent == 0 and caught > 0, (silent, caught)
    part.write_bytes(good)
    assert load_metrics(tmp_path / "out").equals(want)
    bad = bytearray(good)
    bad[start + chunk.total_compressed_size - 5] ^= 0x10  # in the last page's values
    part.write_bytes(bytes(bad))
    from jobs.cli import main

    assert main(["report", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fedray: error: results file") and part.name in err and "damaged" in err


def test_a_part_file_holding_another_runs_rows_is_refused_naming_it(tmp_path, capsys):
    # Before: seed 1's metrics file copied over seed 0's loaded as seed 0's: one seed twice, the other
    # not at all, and `fedray report` exited 0 with a mean over the wrong runs.
    from fedray.storage.files import DamagedResults
    from jobs.cli import main

    runs = [small_config(tmp_path, rounds=2, seed=s) for s in (0, 1)]
    for cfg in runs:
        list(execute(cfg, make_local_federation))
    first, second = (tmp_path / "out" / "metrics" / f"{c.run_id()}-000000.parquet" for c in runs)
    first.write_bytes(second.read_bytes())
    with pytest.raises(
        DamagedResults, match=rf"{first.name}' holds rows of run {runs[1].run_id()}, not of the run"
    ):
        load_metrics(tmp_path / "out")
    assert main(["report", str(tmp_path / "out")]) == 1
    assert first.name in capsys.readouterr().err
    # a file of a run no runs/ row names (a reference run's "-ref" that was never recorded) is not
    # read: its rows are not counted as the run's whose id it extends
    (tmp_path / "out" / "metrics" / f"{runs[1].run_id()}-ref-000000.parquet").write_bytes(second.read_bytes())
    first.unlink()
    capsys.readouterr()
    m = load_metrics(tmp_path / "out")
    assert len(m) == len(m.drop_duplicates()) and set(m["run_id"]) == {runs[1].run_id()}
    assert f"{runs[1].run_id()}-ref-000000.parquet not read" in capsys.readouterr().err


def test_a_copy_of_a_runs_rows_under_another_name_is_not_counted_twice(tmp_path, capsys):
    # Before: metrics/archive.parquet (or any other name) holding a copy of a run's rows doubled them
    runs = small_config(tmp_path, rounds=2)
    list(execute(runs, make_local_federation))
    out = tmp_path / "out"
    before = load_metrics(out)
    (part,) = (out / "metrics").glob("*.parquet")
    for name in ("archive.parquet", "copy.parquet", "backup-2024.parquet"):
        (out / "metrics" / name).write_bytes(part.read_bytes())
    capsys.readouterr()
    after = load_metrics(out)
    assert len(after) == len(before) and after.equals(before)
    err = capsys.readouterr().err
    assert "backup-2024.parquet, copy.parquet not read" in err
    assert (
        "archive.parquet: 1 of its runs have their own files here: their rows are read from those alone"
        in err
    )


def test_a_run_whose_writer_died_is_recorded_with_the_status_it_is_given(tmp_path):
    from analysis import load_events
    from fedray.storage.writer import mark_ended

    out = str(tmp_path)
    for run_id, status in (("a-run", "failed"), ("b-run", "interrupted")):
        ResultsWriter(out, run_id, small_config(tmp_path, rounds=5).to_dict())._write_run(
            "running"
        )  # writer gone
        assert mark_ended(out, run_id, status, 3, "WorkerLost: the node went away", wait_s=1)
        assert run_status(out, run_id) == status
    runs = load_runs(out).set_index("run_id")
    assert runs.loc["a-run", "error"] == "failed after 3 of 5 rounds (WorkerLost: the node went away)"
    events = load_events(out).set_index("run_id")
    assert (events.loc["a-run", "event"], events.loc["b-run", "event"]) == ("failed", "interrupted")


def _read_while_rewritten(rewrite, read, reads: int) -> list:
    """``read()`` ``reads`` times while a thread calls ``rewrite(i)`` (i = 1, 2, ...) over and over;
    what the reads returned. The rewrites must have overlapped the reads (at least one per ten
    reads), and an error in the thread fails the test."""
    import threading

    stop, done, failed = threading.Event(), [0], []

    def loop() -> None:
        try:
            while not stop.is_set():
                done[0] += 1
                rewrite(done[0])
        except BaseException as e:  # noqa: BLE001 - raised in the test below
            failed.append(e)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        got = [read() for _ in range(reads)]
    finally:
        stop.set()
        thread.join()
    if failed:
        raise failed[0]
    assert done[0] >= reads // 10, f"only {done[0]} rewrites during {reads} reads: no race was tried"
    return got


def test_a_row_read_while_its_writer_replaces_it_reads_whole(tmp_path):
    # Two sweeps over one folder: one read a run's row while the other renamed a new row over it,
    # and failed with "results file ... is damaged" (the path was opened again after its footer was
    # read: the old footer, the new file's pages; 814 of 3,000 reads failed so, measured by hand).
    from fedray.storage.files import read_checked, write_atomic

    path = tmp_path / "row.parquet"

    def row(i: int) -> pa.Table:
        return pa.table({"status": ["running" if i % 2 else "finished" + "!" * (i % 7)], "n": [i]})

    write_atomic(row(0), path)
    read = _read_while_rewritten(
        lambda i: write_atomic(row(i), path),
        lambda: read_checked(path, ["status"]).column("status")[0].as_py(),
        1500,
    )
    assert {s.rstrip("!") for s in read} <= {"running", "finished"}


def test_a_run_another_process_holds_is_running_whatever_its_row_says_until_it_ends(tmp_path, monkeypatch):
    # Before: a writer that held the lock before its first row was "new" (and record_failure would
    # have written over it); one that held it over an earlier attempt's row was "interrupted" or
    # "failed"; and one that finished between the row's read and the lock's probe was "interrupted".
    # Each made a second sweep over the folder exit 1 ("NOT FINISHED").
    from fedray.storage.lock import RunLock
    from fedray.storage.results import run_state
    from fedray.storage.writer import record_failure

    out, config = tmp_path / "out", small_config(tmp_path).to_dict()
    w = _writer(tmp_path)
    w.acquire()  # the lock taken, no row written yet: the data and actors are being built
    assert run_state(out, "r") == "running"
    record_failure(out, "r", config, "PlacementError: not here")  # leaves a live writer's run alone
    assert run_status(out, "r") is None
    w.release()
    for earlier in ("interrupted", "failed"):
        _writer(tmp_path)._write_run(earlier)
        assert run_state(out, "r") == earlier
        w = _writer(tmp_path)
        w.acquire()  # another process goes on with it
        assert run_state(out, "r") == "running"
        w.release()
    w = _writer(tmp_path)
    w.start()
    w._write_run("running")
    assert run_state(out, "r") == "running"
    probe, ended = RunLock.held_elsewhere, []

    def writer_ends_first(self) -> bool:
        if not ended:
            ended.append(w.finish({}))
        return probe(self)

    monkeypatch.setattr(RunLock, "held_elsewhere", writer_ends_first)
    assert run_state(out, "r") == "finished" and ended


def test_a_report_read_while_runs_are_written_reads_every_run_whole(tmp_path, monkeypatch):
    # `fedray report` during a sweep: the loader opened each part again after reading its footer,
    # and 54 of 300 reads failed ("Page was smaller than expected") while three runs rewrote their
    # rows (measured by hand). The parts are also read a few files at a time here, as a folder of
    # more parts than may be open at once is.
    import analysis.load

    monkeypatch.setattr(analysis.load, "OPEN_AT_ONCE", 2)
    ws = [_writer(tmp_path, f"r{i}") for i in range(3)]
    for w in ws:
        w.start()
        w._write_run("running")

    def write(rnd: int) -> None:
        for w in ws:
            w.add(rnd, [rec("accuracy", 0.5)])  # flush_every_s=0: the part is rewritten
            w.write_progress({"round": rnd, "note": "x" * (rnd % 50)})

    def read() -> None:
        assert sorted(load_runs(tmp_path / "out")["run_id"]) == ["r0", "r1", "r2"]
        load_metrics(tmp_path / "out")

    _read_while_rewritten(write, read, 100)
    m = load_metrics(tmp_path / "out")
    assert (m.groupby("run_id")["round"].nunique() == m.groupby("run_id")["round"].max()).all()


def test_a_part_removed_since_it_was_listed_is_left_out_and_a_fifo_is_refused_not_waited_on(
    tmp_path, monkeypatch
):
    # A run started over (or cut back to its checkpoint) removes its parts while a report may have
    # listed them; a FIFO named like a part would block a reader that opened it.
    import analysis.load
    from fedray.storage.files import DamagedResults, read_checked

    cfg = small_config(tmp_path, rounds=2)
    list(execute(cfg, make_local_federation))
    want = load_metrics(cfg.output)
    metrics = tmp_path / "out" / "metrics"
    listed = analysis.load._parts
    monkeypatch.setattr(
        analysis.load, "_parts", lambda path, known: [*listed(path, known), path / "r-000009.parquet"]
    )
    pd.testing.assert_frame_equal(load_metrics(cfg.output), want)
    monkeypatch.setattr(analysis.load, "_parts", lambda path, known: [path / "r-000009.parquet"])
    assert load_metrics(cfg.output).empty
    monkeypatch.undo()
    fifo = metrics / f"{cfg.run_id()}-000009.parquet"
    os.mkfifo(fifo)
    said = f"results file {str(fifo)!r} is damaged: not a regular file"
    for reader in (lambda: load_metrics(cfg.output), lambda: read_checked(fifo)):
        with pytest.raises(DamagedResults) as e:
            _unblocked(reader)
        assert str(e.value) == said


def _one_run(tmp_path, **over):
    """A small finished run (its clients' own test splits too: client rows); its config."""
    cfg = small_config(tmp_path, rounds=2, client_test_fraction=0.2, **over)
    list(execute(cfg, make_local_federation))
    return cfg


def test_a_part_copied_under_another_part_number_is_read_once_said_naming_it(tmp_path, capsys):
    # Before: metrics/RUN-000077.parquet, a copy of RUN-000000.parquet, doubled the run's rows (78 for
    # 39) and every mean over them; a copy in clients/ or partitions/ doubled those tables too.
    from analysis import load_clients, load_partitions
    from jobs.cli import main

    cfg = _one_run(tmp_path)
    out, run_id = tmp_path / "out", cfg.run_id()
    before = {
        "metrics": load_metrics(out),
        "clients": load_clients(out),
        "partitions": load_partitions(out),
    }
    copies = {
        "metrics": (f"{run_id}-000000.parquet", f"{run_id}-000077.parquet"),
        "clients": (f"{run_id}-clients.parquet", f"{run_id}-000003.parquet"),
        "partitions": (f"{run_id}.parquet", f"{run_id}-000001.parquet"),
    }
    for table, (src, dst) in copies.items():
        (out / table / dst).write_bytes((out / table / src).read_bytes())
    capsys.readouterr()
    pd.testing.assert_frame_equal(load_metrics(out), before["metrics"])
    pd.testing.assert_frame_equal(load_clients(out), before["clients"])
    pd.testing.assert_frame_equal(load_partitions(out), before["partitions"])
    err = capsys.readouterr().err
    for _, dst in copies.values():  # each copy named once, as the file read around
        assert err.count(f"{dst}: rows that another file of the same run holds too") == 1, err
    # the same rows with other values: which one is the run's cannot be told; refused, naming the file
    part = pq.read_table(out / "metrics" / f"{run_id}-000000.parquet")
    other = part.set_column(part.schema.get_field_index("value"), "value", pa.array([0.5] * part.num_rows))
    pq.write_table(other, out / "metrics" / f"{run_id}-000078.parquet")
    assert main(["report", str(out), "--no-plots"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fedray: error: results file '{out / 'metrics' / f'{run_id}-000078.parquet'}'")
    assert "another of its files holds with another value" in err and "Traceback" not in err


def test_parts_that_only_follow_each_other_are_read_together_and_whole(tmp_path, monkeypatch):
    # A run's parts hold rounds one after the other (a resume starts a new part after the rounds
    # kept): none of them is read apart, so a folder of thousands of parts stays one read.
    import analysis.load
    from fedray.storage import writer

    monkeypatch.setattr(writer, "PART_ROWS", 5)
    w = ResultsWriter(tmp_path, "r", small_config(tmp_path).to_dict(), flush_every_s=0)
    w.start()
    for r in range(1, 9):
        w.add(r, [rec("accuracy", r / 100), rec("loss", r)])
    w.finish({})
    apart = []
    once = analysis.load._once
    monkeypatch.setattr(
        analysis.load, "_once", lambda table, again, keys: apart.extend(again) or once(table, again, keys)
    )
    m = load_metrics(tmp_path)
    assert m[m["metric"] == "loss"]["value"].tolist() == list(range(1, 9)) and apart == []


def test_rows_that_name_no_run_are_not_read(tmp_path, capsys):
    # Before: rows with a null run_id passed the owner check (a footer's smallest and largest value
    # leave nulls out) and were counted; a file of such rows alone failed with a TypeError traceback.
    from jobs.cli import main

    cfg = _one_run(tmp_path)
    out, run_id = tmp_path / "out", cfg.run_id()
    want = load_metrics(out)
    part = pq.read_table(out / "metrics" / f"{run_id}-000000.parquet")
    nameless = part.set_column(0, "run_id", pa.nulls(part.num_rows, pa.string()))
    pq.write_table(pa.concat_tables([part, nameless]), out / "metrics" / f"{run_id}-000000.parquet")
    pq.write_table(nameless, out / "metrics" / f"{run_id}-000005.parquet")  # no run named at all
    capsys.readouterr()
    got = load_metrics(out)
    pd.testing.assert_frame_equal(got, want)
    err = capsys.readouterr().err
    assert err.count("hold rows that name no run (run_id null): those rows are not read") == 1, err
    assert f"{run_id}-000000.parquet, {run_id}-000005.parquet hold rows" in err
    assert main(["report", str(out), "--no-plots"]) == 0


def test_a_sync_tools_conflict_copy_is_read_around_in_every_table_said_once(tmp_path, capsys):
    # Before: runs/RUN (1).parquet (Google Drive's, Dropbox's conflict copy) stopped the whole report
    # ("another run's file copied ..."), while metrics/ skipped the same name with a note.
    from analysis import load_clients
    from jobs.cli import main

    cfg = _one_run(tmp_path)
    out, run_id = tmp_path / "out", cfg.run_id()
    want_runs, want_metrics = load_runs(out), load_metrics(out)
    runs, metrics, clients = out / "runs", out / "metrics", out / "clients"
    copies = {  # copy: its original
        runs / f"{run_id} (1).parquet": runs / f"{run_id}.parquet",
        runs / f"{run_id}.sync-conflict-20260101-120000-ABCDEFG.parquet": runs / f"{run_id}.parquet",
        metrics / f"{run_id}-000000 (conflicted copy 2026-01-01).parquet": metrics
        / f"{run_id}-000000.parquet",
        clients / f"{run_id}-clients copy.parquet": clients / f"{run_id}-clients.parquet",
    }
    for copy, original in copies.items():
        copy.write_bytes(original.read_bytes())
    capsys.readouterr()
    pd.testing.assert_frame_equal(load_runs(out), want_runs)
    pd.testing.assert_frame_equal(load_metrics(out), want_metrics)
    assert len(load_clients(out)) == 6
    err = capsys.readouterr().err
    for copy in copies:
        assert copy.name in err
    assert err.count(f"{out / 'runs'}: ") == 1, err  # one note a folder
    assert main(["report", str(out), "--no-plots"]) == 0
    # a file holding another run's row is still refused (that is no copy beside its original)
    (out / "runs" / "other-run.parquet").write_bytes((out / "runs" / f"{run_id}.parquet").read_bytes())
    with pytest.raises(Exception, match=r"other-run\.parquet' holds rows of run"):
        load_runs(out)
