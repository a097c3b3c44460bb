"""The TensorBoard logger (``--logger tensorboard``; docs/loggers.md): event files under
``OUTPUT/tb/RUN_ID/``, written with ``torch.utils.tensorboard.SummaryWriter`` (which needs the
``tensorboard`` package, ``pip install 'fedray[tensorboard]'``) and flushed as each round ends, so
``tensorboard --logdir OUTPUT/tb`` shows a sweep's runs while they run.

A scalar per metric, scope and entity each round (``test/accuracy``, ``test/cluster/3/accuracy``,
``system/seconds``; `fedray.storage.loggers.base.series` says which, ``slash_name`` how named), the
config as text at a fresh start, the run's end status as text, and the run as a session of the
HParams view (`hparams_of` it, grouped with the other seeds of its setting, its end status). A run that goes on writes a new event file that,
at the first round it is given, purges that step and the later ones of the earlier files (a
``SessionLog`` START, as ``purge_step`` writes): each step is shown once, the rounds done again with
their new values. A failing writer (a full disk) is said once by fedray; its thread prints nothing.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path
from typing import Any

from fedray.records import Record
from fedray.storage.files import refuse_link
from fedray.storage.loggers.base import RunInfo, group, labels, series, slash_name

# the end status as TensorBoard's HParams view shows it (an interrupted run goes on later: unknown)
HPARAMS_STATUS = {"finished": "STATUS_SUCCESS", "stopped": "STATUS_SUCCESS", "failed": "STATUS_FAILURE"}


def hparams_of(info: RunInfo) -> dict[str, Any]:
    """What the HParams view shows of a run: its labels (algorithm, dataset, partition, model, seed),
    the learning rate and every hyperparameter (``hp.NAME``, defaults included where known)."""
    out: dict[str, Any] = {k: v for k, v in labels(info.config).items() if k != "experiment"}
    if isinstance(info.config.get("seed"), int):
        out["seed"] = info.config["seed"]
    if info.config.get("lr") is not None:
        out["lr"] = info.config["lr"]
    hp = {**(info.config.get("hp") or {}), **info.hparams}
    out.update({f"hp.{k}": v for k, v in hp.items()})
    return out


def _hparams_summary(**data: Any) -> Any:
    """A summary of TensorBoard's HParams plugin (``session_start_info=`` or ``session_end_info=``),
    as its own metadata module names and versions it."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    (kind,) = data
    tag = metadata.SESSION_START_INFO_TAG if kind == "session_start_info" else metadata.SESSION_END_INFO_TAG
    content = HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, **data)
    smd = metadata.create_summary_metadata(content)
    return Summary(value=[Summary.Value(tag=tag, metadata=smd, tensor=metadata.NULL_TENSOR)])


def session_start(info: RunInfo) -> Any:
    """The run's HParams session: `hparams_of` it, grouped with the other seeds of its setting."""
    from tensorboard.plugins.hparams.plugin_data_pb2 import SessionStartInfo

    ssi = SessionStartInfo(group_name=group(info.config, info.run_id), start_time_secs=time.time())
    for k, v in hparams_of(info).items():
        if isinstance(v, bool):
            ssi.hparams[k].bool_value = v
        elif isinstance(v, (int, float)):
            ssi.hparams[k].number_value = float(v)
        elif v is not None:
            ssi.hparams[k].string_value = str(v) if not isinstance(v, (list, dict)) else json.dumps(v)
    return _hparams_summary(session_start_info=ssi)


def session_end(status: str) -> Any:
    from tensorboard.plugins.hparams import api_pb2
    from tensorboard.plugins.hparams.plugin_data_pb2 import SessionEndInfo

    code = api_pb2.Status.Value(HPARAMS_STATUS.get(status, "STATUS_UNKNOWN"))
    return _hparams_summary(session_end_info=SessionEndInfo(status=code, end_time_secs=time.time()))


EVENTS = "events.out.tfevents.*"


def config_text(config: dict[str, Any]) -> str:
    """The config as TensorBoard's text tab shows it: YAML in a Markdown code block."""
    try:
        import yaml

        body = yaml.safe_dump(config, sort_keys=False)
    except Exception:  # a value YAML cannot write: JSON, with its text
        body = json.dumps(config, indent=1, default=str)
    return f"```\n{body.rstrip()}\n```"


def _after_earlier_files(events: list[Path]) -> None:
    """Wait, at most a second, until the clock is past the newest event file's second: a file name
    holds the second it was made, and readers take the files in name order, so a file made in the same
    second as an earlier one (a run going on at once) might be read first."""
    stamps = []
    for p in events:
        parts = p.name.split(".")
        if len(parts) > 3 and parts[3].isdigit():
            stamps.append(int(parts[3]))
    wait = max(stamps, default=0) + 1 - time.time()
    if 0 < wait <= 1.5:
        time.sleep(wait)


def _quiet_writer_threads() -> None:
    """TensorBoard's writer thread re-raises what failed it (a full disk), and Python prints that
    traceback; the writer raises the same error again at its next flush, which fedray says in one
    line. So a failure of that thread is not printed: every other thread's goes on as before."""
    from tensorboard.summary.writer.event_file_writer import _AsyncWriterThread

    hook = threading.excepthook
    if getattr(hook, "_fedray_quiet", False):
        return

    def quiet(args: threading.ExceptHookArgs) -> None:
        thread = args.thread
        if isinstance(thread, _AsyncWriterThread) and getattr(thread, "exception", None) is args.exc_value:
            return  # kept by the writer, raised at its next flush or write
        hook(args)

    quiet._fedray_quiet = True  # type: ignore[attr-defined]
    threading.excepthook = quiet


class TensorBoardLogger:
    """A run's scalars as TensorBoard event files in ``OUTPUT/tb/RUN_ID/``."""

    replaces_rounds = True  # re-run rounds are written again; purge_step shows them once

    def __init__(self) -> None:
        self._writer: Any = None
        self._folder: Path | None = None
        self._last = 0
        self._purge = False  # at the first round given: the steps from there on, of earlier files, go

    def start(self, info: RunInfo) -> None:
        from torch.utils.tensorboard import SummaryWriter

        folder = Path(info.output) / "tb" / info.run_id
        refuse_link(folder, "the run's TensorBoard folder")  # its files are removed at a fresh start
        folder.mkdir(parents=True, exist_ok=True)
        events = sorted(p for p in folder.glob(EVENTS) if p.is_file())
        if info.resumed_from == 0:  # a fresh start (--restart, --force): the earlier attempt's curves go
            for p in events:
                p.unlink()
        else:
            _after_earlier_files(events)
        with contextlib.suppress(ImportError, AttributeError):  # a tensorboard without that thread
            _quiet_writer_threads()
        self._writer = SummaryWriter(log_dir=str(folder))
        self._folder = folder
        self._last = info.resumed_from
        self._purge = info.resumed_from > 0
        if info.resumed_from == 0 or not info.previous:
            self._writer.add_text("config", config_text(info.config), 0)
        with contextlib.suppress(ImportError, AttributeError):  # a tensorboard without its HParams plugin
            self._writer._get_file_writer().add_summary(session_start(info), 0)
        self._writer.flush()

    def log_round(self, rnd: int, records: list[Record]) -> None:
        if self._purge:  # what earlier event files hold from this round on is not shown (once each)
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog

            start = SessionLog(status=SessionLog.START)
            self._writer._get_file_writer().add_event(
                Event(step=rnd, wall_time=time.time(), session_log=start)
            )
            self._purge = False
        for scope, entity, metric, value in series(records):
            self._writer.add_scalar(slash_name(scope, entity, metric), value, rnd)
        self._writer.flush()
        self._last = rnd

    def end(self, status: str) -> None:
        if self._writer is None:
            return
        self._writer.add_text("status", f"{status} after round {self._last}", self._last)
        with contextlib.suppress(ImportError, AttributeError):
            self._writer._get_file_writer().add_summary(session_end(status), self._last)
        self._writer.close()
        self._writer = None

    def saved(self) -> dict[str, Any]:
        return {"logdir": str(self._folder.resolve())} if self._folder is not None else {}
