"""fedray from Python: run FedAvg and FedProx on the embedded digits data (10 clients, Dirichlet
label skew), then your own arrays, and print the final accuracies.

    python examples/quickstart.py             # in-process (no Ray), about 15 seconds
    python examples/quickstart.py --ray       # the same runs on a local Ray: the same numbers

The runs go to out/quickstart (out/quickstart-ray with --ray): a run finished there already is
read back, not run again.
"""

from __future__ import annotations

import sys

import numpy as np

import fedray

local = "--ray" not in sys.argv
out = "out/quickstart" if local else "out/quickstart-ray"

# A config is a path, a dict or a fedray.Config; keyword arguments override its keys.
fedavg = fedray.run(rounds=10, output=out, local=local)
fedprox = fedray.run(algorithm="fedprox", hp={"mu": 0.1}, rounds=10, output=out, local=local)
for r in (fedavg, fedprox):
    print(f"{r.config.algorithm:8s} final accuracy {r.final_accuracy:.4f}  ({r.run_id})")
print(fedavg.curve().round(4).to_string())  # accuracy by round, a pandas Series

# Your own data: arrays (or fedray.from_torch for torch Datasets), here three Gaussian classes.
rng = np.random.default_rng(0)
centres = rng.uniform(0, 1, (3, 16))
y_train, y_test = rng.integers(0, 3, 600), rng.integers(0, 3, 150)
x_train = (centres[y_train] + rng.normal(0, 0.2, (600, 16))).astype(np.float32)
x_test = (centres[y_test] + rng.normal(0, 0.2, (150, 16))).astype(np.float32)
data = fedray.from_arrays(x_train, y_train, x_test, y_test, folder=f"{out}/data")
mine = fedray.run(**data, num_clients=5, rounds=5, local_epochs=1, output=out, local=local)
print(f"own data final accuracy {mine.final_accuracy:.4f}; metrics: {len(mine.metrics)} rows")
