#!/usr/bin/env bash
# Set up fedray in ./.venv: Python packages, and Fashion-MNIST where apt can install it.
# Usage: bash scripts/setup.sh            (idempotent; re-running is quick)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip

# torch and torchvision are pinned to a matching pair: on the development machines a CPU-only
# torch 2.13.0 wheel is found first, and torchvision's wheels do not import with it
# ("operator torchvision::nms does not exist"). pyproject.toml itself only asks for ranges.
# One resolver run for everything. Installed modules are byte-compiled here: where
# PYTHONDONTWRITEBYTECODE is set (as on the CI machines), nothing compiled later is kept, and every
# process of the test suite would compile torch and Ray again (the suite then takes twice as long).
# pip compiles one file at a time; compileall uses every core (about 12 s less on 2 cores). A file
# that does not compile is skipped, as pip skips it (torch ships one in Python 3.12's syntax).
.venv/bin/python -m pip install --quiet --no-compile "torch==2.14.1" "torchvision==0.29.1" -e ".[test]"
.venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true

# Real Fashion-MNIST for the benchmark and the paper configs (optional: digits needs nothing).
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 \
    || echo "note: could not apt-get install dataset-fashion-mnist; fmnist runs need data_root or download=true"
fi
echo "fedray is set up in .venv ($(.venv/bin/python -c 'import torch, ray; print(f"torch {torch.__version__}, ray {ray.__version__}")'))"
