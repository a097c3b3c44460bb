"""The TensorBoard logger (``--logger tensorboard``; docs/loggers.md): event files under
``OUTPUT/tb/RUN_ID/``, written with ``torch.utils.tensorboard.SummaryWriter`` (which needs the
``tensorboard`` package, ``pip install 'fedray[tensorboard]'``) and flushed as each round ends, so
``tensorboard --logdir OUTPUT/tb`` shows a sweep's runs while they run.

A scalar per metric, scope and entity each round (``global/accuracy``, ``cluster/3/accuracy``,
``client/12/local_accuracy``; `fedray.storage.loggers.base.series` says which), the config as text at
a fresh start, and the run's end status as text. A run that goes on after round k writes a new event
file that purges steps after k (``purge_step=k + 1``): the rounds done again show their new values, once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from fedray.records import Record
from fedray.storage.files import refuse_link
from fedray.storage.loggers.base import RunInfo, series, slash_name

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


class TensorBoardLogger:
    """A run's scalars as TensorBoard event files in ``OUTPUT/tb/RUN_ID/``."""

    replaces_rounds = True  # re-run rounds are written again; purge_step shows them once

    def __init__(self) -> None:
        self._writer: Any = None
        self._folder: Path | None = None
        self._last = 0

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
        purge = info.resumed_from + 1 if info.resumed_from > 0 else None
        self._writer = SummaryWriter(log_dir=str(folder), purge_step=purge)
        self._folder = folder
        self._last = info.resumed_from
        if info.resumed_from == 0 or not info.previous:
            self._writer.add_text("config", config_text(info.config), 0)
        self._writer.flush()

    def log_round(self, rnd: int, records: list[Record]) -> None:
        for scope, entity, metric, value in series(records):
            self._writer.add_scalar(slash_name(scope, entity, metric), value, rnd)
        self._writer.flush()
        self._last = rnd

    def end(self, status: str) -> None:
        if self._writer is None:
            return
        self._writer.add_text("status", f"{status} after round {self._last}", self._last)
        self._writer.close()
        self._writer = None

    def saved(self) -> dict[str, Any]:
        return {"logdir": str(self._folder.resolve())} if self._folder is not None else {}
