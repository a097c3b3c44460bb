#!/usr/bin/env bash
# The prepared GPU check (run first whenever a GPU is lent; never in CI). From the repository root
# on the GPU machine, with the carried .gpu/ folder (Ray, wheels, Fashion-MNIST: .gpu/setup.sh):
#
#   bash scripts/gpu_check.sh            # about 4 minutes on one H200; writes $OUT/gpu_check.log
#
# 1. FedAvg at the FedConcat paper's budget on Dir(0.1), per client against stacked, and one
#    stacked round profiled (where the time goes);
# 2. MOON (mu 1) on the same cell, per client against stacked;
# 3. FedCat at its paper's budget (100 clients, K = 10 copies, 5 local epochs of batch 50).
set -uo pipefail
cd "$(dirname "$0")/.."
source .gpu/setup.sh || exit 1
export PYTHONUNBUFFERED=1
log=${OUT:-/tmp}/gpu_check.log
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$log"
bench() { echo "== $*" | tee -a "$log"; /usr/bin/time -f "(%e s wall)" python3 -m jobs.bench_batched "$@" --device cuda 2>&1 | tee -a "$log"; }
cell=jobs/configs/bench_gpu_dir01.yaml
bench $cell --rounds 2 --profile 12
bench $cell --rounds 2 --set algorithm=moon --set hp.mu=1
bench $cell --rounds 3 --set algorithm=fedcat --set num_clients=100 --set participation=0.1 --set local_epochs=5 \
  --set batch_size=50 --set model=mcmahan_cnn --set weight_decay=0 --set rounds=500
