"""Every algorithm (tests/engine/test_batched.py's ALL) stacked on Ray, two client actors, against the same
run per client in one process: every round's accuracy within 1e-3 and loss within 1e-4 (relative),
as the test suite checks in one process (its Ray test runs SCAFFOLD only, to keep CI short).

    python -m jobs.bench.batched_on_ray [NAME ...]      # from the repository root; a few minutes on 2 cores

Prints one line per algorithm: agreed, with the largest differences and the stacked calls, or the
error. Exits 1 when one disagrees.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import ray

from actors.federation import make_ray_federation
from fedray.experiment.local import make_local_federation
from fedray.experiment.loop import execute
from tests.conftest import small_config
from tests.engine.test_batched import ALL, BASE, _compare
from tests.helpers import round_metrics


def main(names: list[str]) -> int:
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    bad = 0
    for name in names or list(ALL):
        over = {**BASE, **ALL[name]}
        with tempfile.TemporaryDirectory() as tmp:
            off = small_config(Path(tmp) / "off", batched_clients="off", **over)
            list(execute(off, make_local_federation))
            on = small_config(Path(tmp) / "on", batched_clients="on", num_actors=2, **over)
            calls = list(execute(on, make_ray_federation))[-1].summary["batched_calls"]
            try:
                m = _compare(round_metrics(off.output), round_metrics(on.output))
            except AssertionError as e:
                bad += 1
                print(f"{name:20s} DISAGREES: {e}", flush=True)
                continue
            acc = (m[m.metric.str.endswith("accuracy")].eval("value_off - value_on")).abs().max()
            print(
                f"{name:20s} agrees: largest accuracy difference {acc:.2g}, stacked calls {calls}", flush=True
            )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
