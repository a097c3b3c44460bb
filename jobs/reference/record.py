"""The one shape of a reference: a `Reference` record (what `fedray reference NAME` needs to run the
authors' code beside fedray) and the command-line `Option`s a record may take. Every reference is a
`Reference`, registered in `jobs.reference.registry.REFERENCES`; docs/reference.md ("Adding a
reference") says how to add one.

Standard library and `fedray.config` only: the registry is read when the command line is built, so
importing a record must not import torch or the data sets (a reference module imports those in the
functions that use them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedray.config.keys import ConfigError

if TYPE_CHECKING:
    from fedray.config.keys import Config


class ReferenceError(ConfigError):
    """A run the reference cannot run as configured, or a checkout that is not the reference."""


@dataclass(frozen=True)
class Option:
    """A `fedray reference` option only some references take (the others refuse it, naming both).
    ``default`` is its value when not given; False makes it a switch."""

    flag: str  # --state-dict
    help: str
    default: Any = False
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def switch(self) -> bool:
        return self.default is False


# The options of the wrapper path (`jobs.reference.harness.run_wrapped`): a reference that runs each
# run through a wrapper of its own declares those its wrapper honours.
FORCE = Option("--force", "run reference runs that were imported already again")
PARTITIONS_ONLY = Option("--partitions-only", "draw the reference's partitions, run nothing")
KEEP_LOGGING_EVALS = Option(
    "--keep-logging-evals",
    "run the script's logging-only evaluations instead of replaying their random draws",
)
STATE_DICT = Option(
    "--state-dict",
    "copies: GPU semantics for the script's initial cluster models (default); views: the CPU's",
    default="copies",
    choices=("copies", "views"),
)
# Runs the record's `check` hook instead of a sweep.
CHECK = Option("--check", "show on a tiny run that the wrapper's shortcuts change no weight; then exit")


@dataclass(frozen=True)
class Reference:
    """A reference implementation `fedray reference NAME` runs. The generic path (``run`` None):
    every run of the sweep through ``wrapper`` (``python -m WRAPPER ... -- SCRIPT ARGS``), its
    partition kept and its per-round accuracy imported (`jobs.reference.harness`); fedray then runs
    the same sweep on the reference's partitions. The hooks below replace the steps a reference takes
    its own way (FedRC: clients from its own generator, its own runner)."""

    name: str  # on the command line
    repo: str  # owner/name on GitHub: the imported runs' `source`
    commit: str  # the commit the harness was checked against
    script: str  # the script in the checkout (a checkout without it is refused)
    wrapper: str  # the module that runs it (python -m ...)
    algorithms: frozenset[str]  # fedray's names of the algorithms it runs
    # The generic path's: (cfg, datadir, logdir) -> the script's arguments, raising ReferenceError for
    # what it cannot run (datadir: what prepare_data returned); (cfg, k) -> (round, stage) of its k-th
    # evaluation; (output folder) -> the data folder the script reads (prepared once).
    args: Callable[[Config, Path, Path], list[str]] | None = None
    eval_round: Callable[[Config, int], tuple[int, str]] | None = None
    prepare_data: Callable[[Path], Path] | None = None
    about: str = ""  # for --help, after the name (default: the repository)
    options: tuple[Option, ...] = ()  # the options of its own it takes; any other is refused
    # (ref, checkout, out) -> exit status: what --check runs (CHECK among the options)
    check: Callable[[Reference, Path, Path], int] | None = None
    # (checkout, out, options) -> (a client_files folder, the --set KEY=VALUE putting the runs on it):
    # clients the reference makes itself, before the sweep is read (CONFIG optional then); the
    # fedray side runs the runs as they are, on those clients.
    clients: Callable[[Path, Path, Mapping[str, Any]], tuple[Path, list[str]]] | None = None
    # (cfg) -> anything: raises ReferenceError for a run it cannot run, as soon as the sweep is read
    check_run: Callable[[Config], Any] | None = None
    # (ref, runs, checkout, out, jobs, threads, options) -> runs that failed: the reference side;
    # None: the generic path (`jobs.reference.harness.run_wrapped`)
    run: Callable[[Reference, list[Config], Path, Path, int, int, Mapping[str, Any]], int] | None = None
    report: str = "--cols source,algorithm"  # the `fedray report DIR ...` shown at the end

    def __post_init__(self) -> None:
        if (CHECK in self.options) != (self.check is not None):
            raise ValueError(
                f"reference {self.name!r}: --check among its options and a check hook go together"
            )
        if self.run is None and None in (self.args, self.eval_round, self.prepare_data):
            raise ValueError(
                f"reference {self.name!r}: the generic path needs args, eval_round and prepare_data"
            )
