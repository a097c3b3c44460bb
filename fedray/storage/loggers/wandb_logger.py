"""The Weights & Biases logger (``--logger wandb``; docs/loggers.md): one W&B run per fedray run, in the
project named by config key ``wandb_project`` (by default the experiment's name), its files under
``OUTPUT/wandb/``. ``WANDB_MODE=offline`` keeps everything on the machine (``wandb sync`` sends it
later). Needs ``pip install 'fedray[wandb]'`` (0.19.10 or later: several runs live in one process
with ``reinit="create_new"``, and each is logged through its own run object, never ``wandb.log``).

The W&B run is named by its setting (`fedray.storage.loggers.base.run_name`), grouped with the
other seeds of its setting (``group``), ``job_type`` trial or test, and has an id of its own (the run
id and a random suffix, new at each fresh start), kept in ``OUTPUT/loggers/RUN_ID.json`` before W&B
makes the run, so a run that goes on resumes the same W&B run. Logged: the config (every
hyperparameter in ``hp``), and each round's values as one history row at step = round, named as in
TensorBoard (``test/accuracy``, ``test/cluster/3/accuracy``). A round counts as logged once its row
is in the run's ``.wandb`` file (`RunFile`); a run that goes on logs only the steps its files lack.
Exit code 0 when finished, 1 when failed, 255 when interrupted (0 for a trial a search stopped).
"""

from __future__ import annotations

import contextlib
import re
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fedray.records import Record
from fedray.storage.loggers.base import RunInfo, group, job_type, labels, run_name, series, slash_name

EXIT_CODES = {"finished": 0, "stopped": 0, "failed": 1, "interrupted": 255}
# Seconds between W&B's writes of its run file (its setting x_transaction_log_flush_interval, 15 s by
# default): a round is counted logged once it is in that file, which is what a resume trusts.
FLUSH_INTERVAL_S = 0.1
# Seconds a round waits to be seen in the run's file; past that the logger is said failed and dropped.
CONFIRM_TIMEOUT_S = 30.0
_BLOCK = 32768  # W&B's run file: a 7-byte header, then blocks of chunks


class RunFile:
    """W&B's run file (``run-ID.wandb``, its transaction log) read as it grows: a 7-byte header, then
    32 KiB blocks of chunks (a CRC-32C, a length, a type: full, first, middle, last), each record W&B's
    own protobuf. `steps` reads what was added since the last call; a chunk not yet whole is read later."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pos = 7
        self._pending = b""
        self.max_step = 0

    def records(self) -> Iterator[Any]:
        """The records added since the last call (read from where it stopped)."""
        from wandb.proto import wandb_internal_pb2 as pb

        try:
            with open(self.path, "rb") as f:
                if self._pos == 7 and f.read(4) != b":W&B":
                    return
                f.seek(self._pos)
                data = f.read()
        except FileNotFoundError:
            return
        base, at = self._pos, 0  # the file's offset of data[0]; where in data
        while at + 7 <= len(data):
            pos = base + at
            if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a chunk header is padding
                at += _BLOCK - pos % _BLOCK
                continue
            _, length, kind = struct.unpack("<IHB", data[at : at + 7])
            if (kind == 0 and length == 0) or at + 7 + length > len(data):  # not (all) written yet
                break
            chunk, at = data[at + 7 : at + 7 + length], at + 7 + length
            self._pos = base + at
            if kind in (1, 4):
                record = pb.Record()
                try:
                    record.ParseFromString(self._pending + chunk)
                except Exception:  # a record a kill cut short: skipped, what came before it counts
                    self._pending = b""
                    continue
                self._pending = b""
                yield record
            elif kind in (2, 3):
                self._pending += chunk

    def steps(self) -> int:
        """The last history step the file holds (0: none)."""
        for r in self.records():
            if r.WhichOneof("record_type") == "history":
                self.max_step = max(self.max_step, int(r.history.step.num))
        return self.max_step


def steps_held(output: str | Path, run_id: str) -> int:
    """The last history step that the run files of W&B run ``run_id`` under ``OUTPUT/wandb/`` hold
    (every attempt's folder, offline or online; 0: none)."""
    folder = Path(output) / "wandb"
    if not folder.is_dir():
        return 0
    paths = folder.glob(f"*/run-{run_id}.wandb")  # offline-run-..., run-... (a suffix W&B may add)
    return max((RunFile(p).steps() for p in paths), default=0)


def project_name(name: str) -> str:
    """A W&B project name: the characters it refuses (``/ \\ # ? % :``) as ``-``, at most 128."""
    return re.sub(r"[/\\#?%:]", "-", name)[:128] or "fedray"


def new_id(run_id: str) -> str:
    """A W&B run id for a fresh start of ``run_id``: its text, then a random suffix."""
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '-', run_id)[:48]}-{uuid.uuid4().hex[:8]}"


def check_credentials(wandb: Any) -> None:
    """Online, W&B without an API key asks for one at the terminal, which a logger's thread must never
    do: refuse at once instead (offline, none is needed)."""
    if str(getattr(wandb.setup().settings, "mode", "")) in ("offline", "dryrun", "disabled"):
        return
    try:
        found = wandb.login(prompt=False, verify=False)
    except TypeError:  # a wandb without login(prompt=): its own way
        return
    if not found:
        raise RuntimeError(
            "W&B has no API key here: run `wandb login` (or set WANDB_API_KEY), "
            "or set WANDB_MODE=offline and `wandb sync` later"
        )


class WandbLogger:
    """A run's config and rounds as one W&B run."""

    def __init__(self) -> None:
        self._run: Any = None
        self._file: RunFile | None = None
        self.id = ""
        self.project = ""
        self.mode = ""
        self.keep: Any = None  # set by `Loggers`: writes `saved()` to the run's logger file at once
        self._has = 0  # the last step W&B's files hold of this run (a run gone on)

    def start(self, info: RunInfo) -> None:
        import wandb

        check_credentials(wandb)
        self.project = project_name(str(info.options.get("wandb_project") or "") or info.experiment)
        previous = info.previous  # given only where the run goes on (`Loggers`)
        same = previous.get("project") == self.project and previous.get("id")
        self.id = str(previous["id"]) if same else new_id(info.run_id)
        if same:  # the rounds its files hold already are not logged again
            self._has = steps_held(info.output, self.id)
        elif callable(self.keep):  # the id is in the logger file before W&B makes the run
            self.keep()
        Path(info.output).mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(console="off", silent=True)
        with contextlib.suppress(AttributeError, TypeError, ValueError):  # a wandb without it
            settings.x_transaction_log_flush_interval = FLUSH_INTERVAL_S
        label = labels(info.config)
        tags = [f"{k}:{label[k]}"[:64] for k in ("algorithm", "dataset", "partition", "model") if k in label]
        config = (
            {**info.config, "hp": {**info.config.get("hp", {}), **info.hparams}}
            if info.hparams
            else info.config
        )
        self._run = wandb.init(
            project=self.project,
            name=run_name(info.config, info.run_id, info.label),
            id=self.id,
            resume="allow",
            dir=str(info.output),
            config={**config, "fedray_run_id": info.run_id},
            group=group(info.config, info.run_id)[:128],
            job_type=job_type(info.config),
            tags=tags,
            reinit="create_new",
            settings=settings,
        )
        self.mode = str(getattr(self._run.settings, "mode", "") or "")
        if same:  # online, the server's steps too: W&B drops a row at a step before its run's next one
            with contextlib.suppress(Exception):
                self._has = max(self._has, int(self._run.step) - 1)
        sync_file = getattr(self._run.settings, "sync_file", None)
        writes = self.mode not in ("disabled", "dryrun")  # WANDB_MODE=disabled writes no file
        if writes and sync_file and not getattr(self._run.settings, "x_skip_transaction_log", False):
            self._file = RunFile(Path(sync_file))

    def log_round(self, rnd: int, records: list[Record]) -> None:
        """Round ``rnd``'s values as one history row at step ``rnd``, returned once W&B has written it
        to the run's file (a round W&B's files hold already is not logged again)."""
        row = {slash_name(s, e, m): v for s, e, m, v in series(records)}
        if not row or rnd <= self._has:
            return
        self._run.log(row, step=rnd, commit=True)
        if self._file is None:
            return
        deadline = time.monotonic() + CONFIRM_TIMEOUT_S
        while self._file.steps() < rnd:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"W&B had not written round {rnd} to {self._file.path} {CONFIRM_TIMEOUT_S:g} s after it "
                    "was logged (a full disk?)"
                )
            time.sleep(0.02)

    def end(self, status: str) -> None:
        if self._run is not None:
            self._run.finish(exit_code=EXIT_CODES.get(status, 1))
            self._run = None

    def saved(self) -> dict[str, Any]:
        return {"id": self.id, "project": self.project, "mode": self.mode} if self.id else {}
