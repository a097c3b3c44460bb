"""KarhouTam/FL-bench: FedLC (Zhang et al., ICML 2022) as FL-bench implements it (``src/server/fedlc.py``,
``src/client/fedlc.py``), on the clients another reference drew. FedLC's authors published no code;
FL-bench's is the public implementation docs/algorithms/baselines.md#fedlc and fedray follow.

Like FedRepo's harness, this one draws nothing: it runs on the partitions a NIID-Bench-family harness
left in the same results folder (``DIR/reference/partitions/``, same setting and seed), where FedAvg
and MOON from NIID-Bench's script, and fedray, ran on the very same clients. The wrapper
(`jobs.reference.flbench_wrapper`) builds FL-bench's FedLC server from the checkout's own config and
classes, with fedray's data tensors and the configured model behind FL-bench's interfaces.

What FL-bench does that fedray does not, and how each run here is set:
- a local batch of one sample is skipped (``FedAvgClient.fit``: ``if len(x) <= 1: continue``, kept
  for BatchNorm): a client whose size is 1 more than a multiple of the batch size trains on one sample
  fewer per epoch than in fedray;
- its loss is computed as exp(calibrated logits) normalised, then -log, without the log-sum-exp
  shift: the same function as fedray's cross-entropy of the calibrated logits while float32's exp
  neither overflows (a logit above about 88) nor underflows (the true class's calibrated logit about
  87 or more below zero), which the runs here record as finite weights;
- the clients are visited in a random order each round (``random.sample``), and each client's batch
  shuffle draws from the one global torch generator in that order (fedray draws each client's order
  from its own stream per seed, client, round and epoch): the batch orders differ, as the initial
  models do, so the comparison is over seeds;
- its evaluations: FL-bench's client-side evaluation (before and after local training) is switched
  off (``client_side_evaluation: false``: its clients have no test split here) and the global model is
  tested on the test split after every round, as fedray does;
- its own data pipeline normalises by the data set's mean and std; here both sides train on fedray's
  x / 255, NIID-Bench's scaling, so the two see the same inputs;
- the initial model is drawn after ``fix_random_seed(seed)`` (Python, NumPy, torch), fedray's from its
  own stream: the comparison is over seeds, not paired seed by seed;
- the server weighs clients by their sample counts and resets the optimizer every round
  (``reset_optimizer_on_global_epoch: true``), as fedray does.
"""

from __future__ import annotations

from pathlib import Path

from fedray.config.keys import Config
from jobs.reference import borrowed
from jobs.reference.record import FORCE, Reference

REPO = "KarhouTam/FL-bench"
COMMIT = "06e658b"


def script_args(cfg: Config, out: Path, logdir: Path) -> list[str]:
    """The wrapper's arguments for ``cfg``; ``out`` is the results folder whose reference/partitions/
    hold the clients (a NIID-Bench-family harness drew them there)."""
    hp = borrowed.hparams(cfg, "fedlc", "FL-bench")
    return [*borrowed.script_args(cfg, out), "--tau", f"{hp['tau']:g}"]


FLBENCH = Reference(
    name="fl-bench",
    repo=REPO,
    commit=COMMIT,
    script="src/server/fedlc.py",
    wrapper="jobs.reference.flbench_wrapper",
    algorithms=frozenset({"fedlc"}),
    args=script_args,
    eval_round=lambda cfg, k: (k + 1, ""),  # the centralized test after every round
    prepare_data=lambda out: out,  # the data: fedray's data set, and the partitions already in `out`
    about="KarhouTam/FL-bench's FedLC, on such partitions too",
    options=(FORCE,),  # it draws no partitions and its wrapper skips no computation
)
