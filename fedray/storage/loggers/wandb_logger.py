"""The Weights & Biases logger (``--logger wandb``; docs/loggers.md): one W&B run per fedray run, in the
project named by config key ``wandb_project`` (by default the experiment's name), its files under
``OUTPUT/wandb/``. ``WANDB_MODE=offline`` keeps everything on the machine (``wandb sync`` sends it
later). Needs ``pip install 'fedray[wandb]'`` (0.19.10 or later: several runs live in one process
with ``reinit="create_new"``, and each is logged through its own run object, never ``wandb.log``).

The W&B run is named by the fedray run id and has an id of its own (the run id and a random suffix,
new at each fresh start), kept in ``OUTPUT/loggers/RUN_ID.json``, so a run that goes on resumes the
same W&B run. Logged: the config, and each round's values as one history row at step = round, named
as in TensorBoard (``global/accuracy``, ``cluster/3/accuracy``). Exit code 0 when finished, 1 when
failed, 255 when interrupted (0 for a trial a search stopped).
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

from fedray.records import Record
from fedray.storage.loggers.base import RunInfo, series, slash_name

EXIT_CODES = {"finished": 0, "stopped": 0, "failed": 1, "interrupted": 255}


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
        self.id = ""
        self.project = ""
        self.mode = ""

    def start(self, info: RunInfo) -> None:
        import wandb

        check_credentials(wandb)
        self.project = project_name(str(info.options.get("wandb_project") or "") or info.experiment)
        previous = info.previous if info.resumed_from > 0 else {}
        same = previous.get("project") == self.project and previous.get("id")
        self.id = str(previous["id"]) if same else new_id(info.run_id)
        Path(info.output).mkdir(parents=True, exist_ok=True)
        self._run = wandb.init(
            project=self.project,
            name=info.run_id,
            id=self.id,
            resume="allow",
            dir=str(info.output),
            config=info.config,
            reinit="create_new",
            settings=wandb.Settings(console="off", silent=True),
        )
        self.mode = str(getattr(self._run.settings, "mode", "") or "")

    def log_round(self, rnd: int, records: list[Record]) -> None:
        row = {slash_name(s, e, m): v for s, e, m, v in series(records)}
        if row:
            self._run.log(row, step=rnd)

    def end(self, status: str) -> None:
        if self._run is not None:
            self._run.finish(exit_code=EXIT_CODES.get(status, 1))
            self._run = None

    def saved(self) -> dict[str, Any]:
        return {"id": self.id, "project": self.project, "mode": self.mode} if self.id else {}
