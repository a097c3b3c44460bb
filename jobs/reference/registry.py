"""Reference registry: an explicit dict from `fedray reference NAME` to its `Reference` record
(jobs/reference/record.py), as `fedray.algorithms.ALGORITHMS` is for algorithms. The command line
(jobs/reference/cli.py) reads it for the names, the help, the options each reference takes and the
dispatch; a new reference is one more record here (docs/reference.md, "Adding a reference")."""

from __future__ import annotations

from jobs.reference.fedrc import FEDRC
from jobs.reference.fedrepo import FEDREPO
from jobs.reference.flbench import FLBENCH
from jobs.reference.niid_bench import FEDCONCAT, NIID_BENCH
from jobs.reference.record import Option, Reference

REFERENCES: dict[str, Reference] = {r.name: r for r in (FEDCONCAT, NIID_BENCH, FEDREPO, FLBENCH, FEDRC)}


def options() -> dict[str, Option]:
    """Every option some reference takes, by flag, in the order the records declare them (one flag,
    one definition: two references that take it share the `Option`)."""
    out: dict[str, Option] = {}
    for ref in REFERENCES.values():
        for opt in ref.options:
            if out.setdefault(opt.flag, opt) != opt:
                raise ValueError(f"{opt.flag}: {ref.name} declares it otherwise than another reference")
    return out


def takers(opt: Option) -> list[str]:
    """The references that take ``opt``."""
    return [name for name, ref in REFERENCES.items() if opt in ref.options]
