"""Several Ray nodes on one machine (ray.cluster_utils.Cluster): placement across nodes, node loss,
a plug-in outside the package on two nodes.

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
ray.init(address=cluster.address)
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
ray.shutdown()
cluster.shutdown()
print("OK")
"""


@pytest.mark.slow
def test_actors_spread_over_nodes_and_node_loss_is_loud():
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("OK"), p.stdout + p.stderr[-3000:]
    assert "actors 3 nodes 3" in p.stdout
    assert "plugin on 2 nodes: same numbers" in p.stdout
