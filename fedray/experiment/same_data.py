"""A run goes on, or counts as finished, only on the data it read (`fedray.data.identity`).

Checked twice: before anything of a run starts (`refuse_other_data`: `fedray run`, `fedray.run`, a
sweep's plan), against what its row in ``runs/`` records; and by the round loop itself against its
checkpoint (`resume_refusal`), where a run is resumed on a Ray node or after the plan was made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedray.data.identity import DataChanged, changes, identity
from fedray.storage.checkpoint import Checkpoints
from fedray.storage.results import run_data

if TYPE_CHECKING:
    from fedray.config.keys import Config


def finished_refusal(run_id: str, output: str, said: str) -> str:
    return (
        f"run {run_id} finished in {output}/ on other data than it reads now ({said}): its results are not "
        "this data's. --force runs it again on this data (its results replaced), or give it another "
        "output folder"
    )


def resume_refusal(run_id: str, output: str, rounds: int | None, said: str) -> str:
    after = f" after round {rounds}" if rounds is not None else ""
    return (
        f"run {run_id} in {output}/ would go on from its checkpoint{after} on other data than its first "
        f"rounds read ({said}). --restart starts it over on this data, or give it another output folder"
    )


def other_data(cfg: Config, state: str, force: bool = False, restart: bool = False) -> str | None:
    """Why ``cfg``'s run, found in ``state`` (`fedray.storage.results.run_state`) in its output folder,
    may not be skipped as finished (unless ``force``) or go on from its checkpoint (unless
    ``restart``) on the data it reads now; None where it may."""
    run_id = cfg.run_id()
    finished = state == "finished" and not force
    resumes = (
        state in ("interrupted", "stopped", "failed")
        and not restart
        and Checkpoints(cfg.output, run_id).exist()
    )
    if not (finished or resumes):
        return None
    said = changes(run_data(cfg.output, run_id), identity(cfg.data_section))
    if said is None:
        return None
    return (
        finished_refusal(run_id, cfg.output, said)
        if finished
        else resume_refusal(run_id, cfg.output, None, said)
    )


def refuse_other_data(cfg: Config, state: str, force: bool = False, restart: bool = False) -> None:
    """`other_data`, raised (`DataChanged`) before anything of the run starts."""
    if why := other_data(cfg, state, force, restart):
        raise DataChanged(why)
