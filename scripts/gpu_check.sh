#!/usr/bin/env bash
# The prepared GPU check (run first whenever a GPU is lent; never in CI). From the repository root
# on the GPU machine, with the carried .gpu/ folder (Ray, wheels, Fashion-MNIST: .gpu/setup.sh), which
# `bash scripts/gpu_prepare.sh` builds on the development machine first (about 40 s; not committed):
#
#   bash scripts/gpu_check.sh          # the three targets and the decisions, under 8 minutes on one
#                                      # H200 (its parts' limits add to 470 s); writes $OUT/gpu_check.log
#   bash scripts/gpu_check.sh fedrc    # FedRC's round as it runs, without the stacked E-step, and as before (at most 7 minutes)
#   bash scripts/gpu_check.sh engines  # the engines' comparison (about 5 minutes)
#   bash scripts/gpu_check.sh widths   # a stacked call's time against its width (at most 4 minutes)
#   bash scripts/gpu_check.sh kernels  # the stacked step under each CUDA kernel setting (at most 5 minutes)
#   bash scripts/gpu_check.sh conv     # a stacked round profiled with each convolution, stacked_cnn (at most 6 minutes)
#   bash scripts/gpu_check.sh pack     # packed runs against runs alone and sharing (at most 4 minutes)
#   bash scripts/gpu_check.sh tune     # a fedray tune of MOON's mu on FMNIST, packed and not (at most 5 minutes)
#
# table (default): every figure the GPU issue's targets and decisions need, each part under its own
# time limit, in this order (a run cut off by its limit loses the last parts; each part prints as
# it goes):
#   1. FedAvg's stacked round alone on the FedConcat paper's Dir(0.1) cell (bench_batched: s a round,
#      FLOP/s against the peak, stacked work, evaluation s; target 0.25 s), then with the stack's
#      convolutions as im2col + batched matmul (--stacked-conv im2col), then with the step compiled
#      (--stacked-compile: about 90 operations a step fused; its first round, untimed, compiles):
#      either becomes the CUDA default where it makes the round 1.2x faster;
#   2. FedRC's round at the FedRC paper's budget (FMNIST-C, 300 training clients, K = 3) as fedray
#      now runs it (a folded call as wide as the device allows, its E-step's K models one stacked
#      forward), then FedAvg's round on the same data: target FedRC at most (K + 1) = 4x FedAvg's
#      (6.8x on 2026-11-27, 44 s against 6.9 s);
#   3. one partition row of the FedConcat paper's table (jobs/configs/bench_table1_row.yaml: Dir(0.1),
#      14 runs, one seed, 3 rounds each) through `fedray sweep` on Ray, four runs sharing the GPU,
#      timed end to end, and what it says the whole table would take at the paper's budget
#      (jobs/bench/row_times.py; target under 60 minutes).
# MOON's rounds and stacked_cnn, once in the default, are in `engines` and `conv`; packs against
# sharing (pack_runs auto's decision) in `pack`.
# fedrc: FedRC at the FedRC paper's budget (FMNIST-C, 303 clients), stacked rounds, with the clients
#   a call as fedray gives them on a GPU (a 32nd of the device's memory of replies a call: 174 of
#   its 300 training clients, 522 models a stack, on an H200; its E-step's K models one stacked
#   forward), with a pass a model (--stacked-eval off), and as before 2026-12-02 (--fold-mb 64
#   --stacked-eval off: 2 clients a call, a pass a model): whether its 44 s round was the calls'
#   cost, and whether the stacked forward pays on a GPU (stacked_eval auto's decision).
# widths: jobs/bench/stack_widths.py on the table's cell, 40 to 640 models a stack, grouped convolution
#   against im2col + batched matmul, and the balanced (iid) cell beside Dir(0.1): what packing runs and
#   ragged stacks can gain.
# kernels: jobs/bench/stack_widths.py on the table's cell at widths 1 and 4 under each kernel setting:
#   as fedray runs it, without deterministic kernels, with cuDNN's timed algorithm pick, without
#   channels-last, without TF32: which one the grouped convolutions (1.3-2% of the float32 peak)
#   are slow under, the next lever for the table's time.
# conv: FedAvg's stacked round on the cell profiled (torch.profiler, 12 costliest operators) with the
#   grouped convolution and with im2col + batched matmul, and stacked_cnn at 40 and 160 models.
# engines: per client against stacked for FedAvg (profiled), MOON and FedCat at their papers' budgets.
# tune: `fedray tune jobs/configs/tune_moon_fmnist_halving.yaml` at 6 rounds of one epoch (9 trials
#   to round 2, the best 3 to round 6: 36 trial-rounds), its trials a quarter of the GPU each, packed
#   (pack_runs auto: a rung's trials in one stack) and not: trial-rounds a second of each, against
#   0.082 on the 2-core development machine at the full config (docs/tuning.md#figures).
# pack: packed runs (pack_runs): 4 FedAvg seeds of the cell alone one after another against one pack
#   (jobs.bench.pack: run-rounds a second); then the Table 1 row through `fedray sweep` with
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
    timeout "$limit" /usr/bin/time -f "(%e s wall)" python3 -m jobs.bench.batched "$@" --device cuda 2>&1 | tee -a "$log"
}
cell=jobs/configs/bench_gpu_dir01.yaml

if [ "${1:-table}" = fedrc ]; then
    # FedRC's round as it runs (replies a call as the device allows, a client's K models evaluated
    # stacked), then with a pass a model (whether the stacked forward pays on a GPU: on the CPU it
    # doubled the round), then as before 2026-12-02 (64 MB a call: 2 clients, 6 models a stack; a
    # pass a model): how much of its round was the calls' own cost.
    # Each round prints as it ends (the first is untimed), so a cut-off run still shows its rounds.
    for part in "170 --only algorithm=fedrc --only hp.finetune=false" \
        "130 --only algorithm=fedrc --only hp.finetune=false --stacked-eval off" \
        "130 --only algorithm=fedrc --only hp.finetune=false --fold-mb 64 --stacked-eval off"; do
        # shellcheck disable=SC2086
        bench ${part%% *} jobs/configs/fedrc_fmnist.yaml --rounds 2 --engines batched --only lr=0.06 --only seed=0 ${part#* }
    done
    exit 0
fi
if [ "${1:-table}" = widths ]; then
    for part in "170 --widths 1,4,16 --conv grouped,im2col" "60 --widths 1,4 --set partition=iid"; do
        say "stack_widths ${part#* }"
        # shellcheck disable=SC2086
        timeout ${part%% *} python3 -m jobs.bench.stack_widths $cell --device cuda ${part#* } 2>&1 | tee -a "$log"
    done
    exit 0
fi
if [ "${1:-table}" = kernels ]; then
    for part in "" "--set cuda_deterministic=false" "--set cuda_deterministic=false --cudnn-benchmark" \
        "--set channels_last=false" "--set cuda_tf32=false"; do
        say "stack_widths --widths 1,4 $part"
        # shellcheck disable=SC2086
        timeout 55 python3 -m jobs.bench.stack_widths $cell --device cuda --widths 1,4 $part 2>&1 | tee -a "$log"
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
    timeout 100 python3 -m jobs.bench.stacked_cnn --device cuda --models 40,160 --steps 300 2>&1 | tee -a "$log"
    exit 0
fi
if [ "${1:-table}" = pack ]; then
    say "bench_pack $cell --runs 4 --rounds 4"
    timeout 100 python3 -m jobs.bench.pack $cell --device cuda --runs 4 --rounds 4 2>&1 | tee -a "$log"
    row=/tmp/table1-row-packed
    say "fedray sweep jobs/configs/bench_table1_row.yaml --set pack_runs=auto (packs of 4, a quarter of the GPU each)"
    start=$(date +%s)
    timeout 150 python3 -m jobs.cli sweep jobs/configs/bench_table1_row.yaml --output $row \
        --set num_gpus_per_actor=0.25 --set num_cpus_per_actor=2 --set pack_runs=auto 2>&1 | tail -24 | tee -a "$log"
    say "sweep wall $(($(date +%s) - start)) s"
    python3 -m jobs.bench.row_times $row 4 2>&1 | tee -a "$log"
    exit 0
fi
if [ "${1:-table}" = tune ]; then
    for pack in auto off; do
        out=/tmp/tune-moon-$pack
        say "fedray tune jobs/configs/tune_moon_fmnist_halving.yaml (6 rounds of 1 epoch, a quarter of the GPU a trial, pack_runs $pack)"
        start=$(date +%s)
        timeout 140 python3 -m jobs.cli tune jobs/configs/tune_moon_fmnist_halving.yaml --output $out \
            --set rounds=6 --set local_epochs=1 --set tune.scheduler.successive_halving.grace_rounds=2 \
            --set num_gpus_per_actor=0.25 --set num_cpus_per_actor=2 --set pack_runs=$pack \
            --progress-every 20 2>&1 | tail -12 | tee -a "$log"
        wall=$(($(date +%s) - start))
        say "tune wall $wall s (pack_runs $pack)"
        python3 - "$out/tuned.yaml" "$wall" <<'PY' 2>&1 | tee -a "$log"
import sys, yaml
cell = yaml.safe_load(open(sys.argv[1]))["cells"][0]
wall = float(sys.argv[2])
print(f"trial-rounds {cell['trial_rounds']} of {cell['full_trial_rounds']}; {cell['trial_rounds'] / wall:.3f} trial-rounds/s; chosen {cell['chosen']}")
PY
    done
    exit 0
fi
if [ "${1:-table}" = engines ]; then
    bench 200 $cell --rounds 2 --profile 12
    bench 200 $cell --rounds 2 --set algorithm=moon --set hp.mu=1
    bench 100 $cell --rounds 3 --set algorithm=fedcat --set num_clients=100 --set participation=0.1 \
        --set local_epochs=5 --set batch_size=50 --set model=mcmahan_cnn --set weight_decay=0 --set rounds=500
    exit 0
fi

# 1. FedAvg's round alone on the cell: as it runs, with im2col, compiled
for part in "40 " "40 --stacked-conv im2col" "70 --stacked-compile"; do
    # shellcheck disable=SC2086
    bench ${part%% *} $cell --rounds 3 --engines batched --set algorithm=fedavg ${part#* }
done

# 2. FedRC's round at its paper's budget as it runs now, then FedAvg's on the same data
fedrc=jobs/configs/fedrc_fmnist.yaml
bench 150 $fedrc --rounds 2 --engines batched --only algorithm=fedrc --only hp.finetune=false --only lr=0.06 --only seed=0
bench 40 $fedrc --rounds 2 --engines batched --only algorithm=fedavg --only lr=0.06 --only seed=0

# 3. a row of the table through `fedray sweep`, four runs sharing the GPU
row=/tmp/table1-row
say "fedray sweep jobs/configs/bench_table1_row.yaml (one actor a run, a quarter of the GPU each, 4 runs at once)"
start=$(date +%s)
timeout 130 python3 -m jobs.cli sweep jobs/configs/bench_table1_row.yaml --output $row \
    --set num_gpus_per_actor=0.25 --set num_cpus_per_actor=2 --max-concurrent-runs 4 2>&1 | tail -20 | tee -a "$log"
say "sweep wall $(($(date +%s) - start)) s"
python3 -m jobs.bench.row_times $row 4 2>&1 | tee -a "$log"
