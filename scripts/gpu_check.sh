#!/usr/bin/env bash
# The prepared GPU check (run first whenever a GPU is lent; never in CI). From the repository root
# on the GPU machine, with the carried .gpu/ folder (Ray, wheels, Fashion-MNIST: .gpu/setup.sh), which
# `bash scripts/gpu_prepare.sh` builds on the development machine first (about 40 s; not committed):
#
#   bash scripts/gpu_check.sh          # about 8 minutes on one H200 (its parts' limits add to 12: under a
#                                      # 590 s limit the last parts give way); writes $OUT/gpu_check.log
#   bash scripts/gpu_check.sh fedrc    # FedRC's round, 2 and 40 clients a call (at most 5 minutes)
#   bash scripts/gpu_check.sh engines  # the engines' comparison (about 5 minutes)
#   bash scripts/gpu_check.sh widths   # a stacked call's time against its width (at most 4 minutes)
#   bash scripts/gpu_check.sh kernels  # the stacked step under each CUDA kernel setting (at most 5 minutes)
#   bash scripts/gpu_check.sh conv     # a stacked round profiled with each convolution (at most 6 minutes)
#   bash scripts/gpu_check.sh pack     # packed runs against runs alone and sharing (at most 4 minutes)
#
# table (default), the GPU table's issue, each part under its own time limit, in this order (what
# the table's time needs first: a run cut off by its limit loses the last parts):
#   1. the stacked engine's round at the FedConcat paper's budget on Dir(0.1) for FedAvg and MOON
#      (bench_batched: s a round, FLOP/s against the peak, stacked work, evaluation s), both again
#      with the stack's convolutions as im2col + batched matmul (--stacked-conv im2col);
#   2. one partition row of that paper's table (jobs/configs/bench_table1_row.yaml: Dir(0.1), 14 runs,
#      one seed, 3 rounds each) through `fedray sweep` on Ray, timed end to end, and what it says the
#      whole table would take at the paper's budget (scripts/row_times.py);
#   3. FedAvg's round with the stack's step compiled (--stacked-compile: about 90 operations a step
#      fused; its first round, untimed, compiles), with the grouped convolution and with im2col. A
#      step was about 0.5 ms fixed plus 37 us a model (2026-11-27): the convolution is the second
#      term, the fusion the first. (FedProx, FedRS and FedLC were within 8% of FedAvg twice, and a
#      stack's widths were measured twice: no longer run here.)
#   4. one SGD step of 40 to 640 simple CNNs written four ways (scripts/stacked_cnn.py): whether a
#      convolution that does not launch per model (im2col + batched matmul) beats vmap's grouped one.
# fedrc: FedRC at the FedRC paper's budget (FMNIST-C, 303 clients), stacked rounds, with the clients
#   a call as fedray gives them (2) and with 40 (--fold-mb 1024): whether its 44 s round is the calls' cost.
# widths: scripts/stack_widths.py on the table's cell, 40 to 640 models a stack, grouped convolution
#   against im2col + batched matmul, and the balanced (iid) cell beside Dir(0.1): what packing runs and
#   ragged stacks can gain.
# kernels: scripts/stack_widths.py on the table's cell at widths 1 and 4 under each kernel setting:
#   as fedray runs it, without deterministic kernels, with cuDNN's timed algorithm pick, without
#   channels-last, without TF32: which one the grouped convolutions (1.3-2% of the float32 peak)
#   are slow under, the next lever for the table's time.
# conv: FedAvg's stacked round on the cell profiled (torch.profiler, 12 costliest operators) with the
#   grouped convolution and with im2col + batched matmul, and stacked_cnn at 40 and 160 models.
# engines: per client against stacked for FedAvg (profiled), MOON and FedCat at their papers' budgets.
# pack: packed runs (pack_runs): 4 FedAvg seeds of the cell alone one after another against one pack
#   (jobs.bench_pack: run-rounds a second); then the Table 1 row through `fedray sweep` with
#   pack_runs auto (packs of one algorithm's runs, four packs sharing the GPU a quarter each), to set
#   beside the table mode's row (four runs sharing the GPU, unpacked: 91 s wall, 1,920 run-seconds
#   at the paper's budget on 2026-11-28).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ ! -f .gpu/setup.sh ]; then
    echo "gpu_check: no .gpu/setup.sh: run bash scripts/gpu_prepare.sh on the development machine, and carry .gpu" >&2
    exit 1
fi
source .gpu/setup.sh || exit 1
export PYTHONUNBUFFERED=1
log=${OUT:-/tmp}/gpu_check.log
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$log"
say() { echo "== $*" | tee -a "$log"; }
bench() {
    local limit=$1
    shift
    say "bench_batched $*"
    timeout "$limit" /usr/bin/time -f "(%e s wall)" python3 -m jobs.bench_batched "$@" --device cuda 2>&1 | tee -a "$log"
}
cell=jobs/configs/bench_gpu_dir01.yaml

if [ "${1:-table}" = fedrc ]; then
    # FedRC's round as it runs (its 303 clients 2 to a call: 64 MB of replies a call), then with
    # 1 GB a call (40 clients, 120 models a stack): how much of its round is the calls' own cost.
    # Each round prints as it ends (the first is untimed), so a cut-off run still shows its rounds.
    for part in "170 --only algorithm=fedrc --only hp.finetune=false" \
        "130 --only algorithm=fedrc --only hp.finetune=false --fold-mb 1024"; do
        # shellcheck disable=SC2086
        bench ${part%% *} jobs/configs/fedrc_fmnist.yaml --rounds 2 --engines batched --only lr=0.06 --only seed=0 ${part#* }
    done
    exit 0
fi
if [ "${1:-table}" = widths ]; then
    for part in "170 --widths 1,4,16 --conv grouped,im2col" "60 --widths 1,4 --set partition=iid"; do
        say "stack_widths ${part#* }"
        # shellcheck disable=SC2086
        timeout ${part%% *} python3 -m scripts.stack_widths $cell --device cuda ${part#* } 2>&1 | tee -a "$log"
    done
    exit 0
fi
if [ "${1:-table}" = kernels ]; then
    for part in "" "--set cuda_deterministic=false" "--set cuda_deterministic=false --cudnn-benchmark" \
        "--set channels_last=false" "--set cuda_tf32=false"; do
        say "stack_widths --widths 1,4 $part"
        # shellcheck disable=SC2086
        timeout 55 python3 -m scripts.stack_widths $cell --device cuda --widths 1,4 $part 2>&1 | tee -a "$log"
    done
    exit 0
fi
if [ "${1:-table}" = conv ]; then
    # where a stacked FedAvg round's time goes with each convolution (the profile's costliest
    # operators on the host and the device), and stacked_cnn at more steps
    for conv in grouped im2col; do
        bench 120 $cell --rounds 2 --engines batched --stacked-conv $conv --profile 12
    done
    say "stacked_cnn --steps 300"
    timeout 100 python3 -m scripts.stacked_cnn --device cuda --models 40,160 --steps 300 2>&1 | tee -a "$log"
    exit 0
fi
if [ "${1:-table}" = pack ]; then
    say "bench_pack $cell --runs 4 --rounds 4"
    timeout 100 python3 -m jobs.bench_pack $cell --device cuda --runs 4 --rounds 4 2>&1 | tee -a "$log"
    row=/tmp/table1-row-packed
    say "fedray sweep jobs/configs/bench_table1_row.yaml --set pack_runs=auto (packs of 4, a quarter of the GPU each)"
    start=$(date +%s)
    timeout 150 python3 -m jobs.cli sweep jobs/configs/bench_table1_row.yaml --output $row \
        --set num_gpus_per_actor=0.25 --set num_cpus_per_actor=2 --set pack_runs=auto 2>&1 | tail -24 | tee -a "$log"
    say "sweep wall $(($(date +%s) - start)) s"
    python3 scripts/row_times.py $row 4 2>&1 | tee -a "$log"
    exit 0
fi
if [ "${1:-table}" = engines ]; then
    bench 200 $cell --rounds 2 --profile 12
    bench 200 $cell --rounds 2 --set algorithm=moon --set hp.mu=1
    bench 100 $cell --rounds 3 --set algorithm=fedcat --set num_clients=100 --set participation=0.1 \
        --set local_epochs=5 --set batch_size=50 --set model=mcmahan_cnn --set weight_decay=0 --set rounds=500
    exit 0
fi

# The eager rounds, the row through `fedray sweep`, then the compiled rounds and stacked_cnn: in
# the order of what the table's time needs first, so a run cut off by its time limit loses the last.
for part in "60 fedavg" "60 moon --set hp.mu=1" "60 fedavg --stacked-conv im2col" \
    "60 moon --set hp.mu=1 --stacked-conv im2col"; do
    # shellcheck disable=SC2086
    bench ${part%% *} $cell --rounds 3 --engines batched --set algorithm=${part#* }
done

row=/tmp/table1-row
say "fedray sweep jobs/configs/bench_table1_row.yaml (one actor a run, a quarter of the GPU each, 4 runs at once)"
start=$(date +%s)
timeout 200 python3 -m jobs.cli sweep jobs/configs/bench_table1_row.yaml --output $row \
    --set num_gpus_per_actor=0.25 --set num_cpus_per_actor=2 --max-concurrent-runs 4 2>&1 | tail -20 | tee -a "$log"
say "sweep wall $(($(date +%s) - start)) s"
python3 scripts/row_times.py $row 4 2>&1 | tee -a "$log"

for part in "100 fedavg --stacked-compile" "100 fedavg --stacked-compile --stacked-conv im2col"; do
    # shellcheck disable=SC2086
    bench ${part%% *} $cell --rounds 3 --engines batched --set algorithm=${part#* }
done

say "stacked_cnn: one step of M simple CNNs as vmap makes it, vmap with im2col, a grouped convolution, im2col + bmm"
timeout 80 python3 -m scripts.stacked_cnn --device cuda --models 40,160,640 --steps 100 2>&1 | tee -a "$log"
