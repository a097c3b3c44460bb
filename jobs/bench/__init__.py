"""The benchmarks: scripts that print figures (docs/benchmark.md holds them, with the machine and
the budget each was measured on), never timed tests.

- `headline` (``python -m jobs.bench``, ``fedray bench``): fedray on Ray and ``--local`` against
  plain PyTorch loops over the same clients;
- `batched`, `stacked_cnn`, `stack_widths`, `row_times`, `batched_on_ray`: the stacked engine;
- `cuda`: the CUDA path against the CPU; `checkpoint`: what checkpoints cost; `scale`: a round
  as the client count grows; `leaf`: LEAF's data sets at their scale; `fedcat`: FedCat's hand-offs;
  `pack`, `sweep`: packed runs and sweeps on one Ray; `attach_fresh_cluster`: attaching to a fresh
  two-node cluster;
- `one_run`: the run a benchmark takes from a run or sweep file.

Run each from the repository root: ``python -m jobs.bench.NAME --help``.
"""
