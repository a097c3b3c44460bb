"""Several Ray nodes on one machine (ray.cluster_utils.Cluster): placement across nodes, node loss
(loud on a bare federation; survived by a run, from its checkpoint), a plug-in outside the package
on two nodes.

Runs in a subprocess: the suite's shared Ray session stays untouched.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = r"""
import sys, tempfile
from pathlib import Path
import ray
from ray.cluster_utils import Cluster
from tests.conftest import small_config
from fedray.data import build_federated_data
from actors.federation import RayFederation
from tests.helpers import count_calls

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})  # the head hosts only the coordinator
workers = [cluster.add_node(num_cpus=1, num_gpus=1) for _ in range(3)]
cluster.wait_for_nodes()
from actors.driver import job_runtime_env
ray.init(address=cluster.address, runtime_env=job_runtime_env())
out = Path(tempfile.mkdtemp())
cfg = small_config(out, num_gpus_per_actor=0.5, num_clients=6)
fed = RayFederation(cfg, build_federated_data(cfg))
nodes = {i["node_id"] for i in fed.actor_info}
print("actors", len(fed.actors), "nodes", len(nodes), flush=True)
assert len(fed.actors) == 3, fed.actor_info            # 3 CPUs at 1 each, although 3 GPUs / 0.5 would allow 6
assert nodes == {w.node_id for w in workers}, nodes    # one per worker node: nothing fits on the head
replies = fed.map(count_calls, fed.client_ids, "x")
assert sorted(replies) == list(range(6))
victim = fed.actor_info[0]["node_id"]
cluster.remove_node(next(w for w in workers if w.node_id == victim))
try:
    fed.map(count_calls, fed.client_ids, "y")
except RuntimeError as e:
    assert "client actor died" in str(e), e
    print("node loss:", str(e)[:80], flush=True)
else:
    sys.exit("no error after losing a node")
fed.close()
# A plug-in outside the package (examples/plugin), on the nodes that are left: the same numbers as in-process.
# fedray attaches to the cluster itself, so the plug-in's file goes with the job (py_modules).
ray.shutdown()
from fedray.api import run
cfg = str(Path("examples/plugin/config.yaml").resolve())
on_ray = run(cfg, rounds=2, num_actors=2, output=str(out / "ray"), address=cluster.address)
shipped = ray.get_runtime_context().runtime_env.get("py_modules") or []
assert len(shipped) == 1 and shipped[0].startswith("gcs://"), shipped  # uploaded for every node
local = run(cfg, rounds=2, local=True, output=str(out / "local"))
a, b = (r.metrics[~r.metrics["metric"].str.contains("seconds|bytes")].set_index(["round", "metric", "scope", "entity"])
        ["value"].sort_index() for r in (on_ray, local))
assert on_ray.summary["placement"]["nodes"] == 2 and len(a) > 10 and a.equals(b), (on_ray.summary, a.compare(b))
print("plugin on", on_ray.summary["placement"]["nodes"], "nodes: same numbers", flush=True)
# A run that loses a node mid-run goes on from its checkpoint on the node left (argv[1]: its config).
import json
from actors.driver import RunHandle, stream_run
from fedray.experiment.loop import Recovered, RoundDone, Started
from fedray.experiment.checks import from_dict
ray.shutdown()
ray.init(address=cluster.address, log_to_driver=False, runtime_env=job_runtime_env())
cfg = from_dict(json.loads(sys.argv[1]))
handle, seen, removed = RunHandle(), [], None
left = [w for w in workers if w.node_id != victim]
for ev in stream_run(cfg, handle=handle):
    seen.append(type(ev).__name__)
    if isinstance(ev, RoundDone) and ev.round == 4 and removed is None:
        node = ray.get(handle.group.actors[0].info.remote())["node_id"]
        removed = next(w for w in left if w.node_id == node)
        cluster.remove_node(removed)
    if isinstance(ev, Started):
        seen[-1] = f"Started:{ev.placement['actors']}:{ev.placement['nodes']}:{ev.resumed_from}"
print("RESULT " + json.dumps(seen), flush=True)
ray.shutdown()
cluster.shutdown()
print("OK")
"""


@pytest.mark.slow
def test_actors_spread_over_nodes_and_node_loss_is_loud_or_survived(tmp_path):
    import json
    import os

    from fedray.experiment.local import make_local_federation
    from fedray.experiment.loop import execute
    from tests.conftest import small_config
    from tests.federation.test_recovery_ray import SLOW
    from tests.helpers import stored_metrics

    cfg = small_config(tmp_path / "ray", num_actors=0, **SLOW)
    ref = small_config(tmp_path / "ref", **SLOW)
    list(execute(ref, make_local_federation))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(cfg.to_dict())],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stdout[-3000:] + p.stderr[-3000:]
    assert "actors 3 nodes 3" in p.stdout
    assert "plugin on 2 nodes: same numbers" in p.stdout
    # the run that lost a node mid-run: it went on from its checkpoint on the node left, with the
    # numbers of the same run in one process
    seen = json.loads(p.stdout.split("RESULT ", 1)[1].splitlines()[0])
    starts = [s for s in seen if s.startswith("Started")]
    assert starts[0] == "Started:2:2:0", seen  # an actor on each of the two worker nodes left
    assert "Recovered" in seen and len(starts) == 2
    _, actors, nodes, resumed = starts[1].split(":")
    assert (actors, nodes) == ("1", "1") and int(resumed) in (3, 6), seen  # on the node left
    got, want = stored_metrics(cfg.output), stored_metrics(ref.output)
    assert got.equals(want), got.compare(want)
