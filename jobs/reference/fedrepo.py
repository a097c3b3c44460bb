"""lxcnju/FedRepo: FedRS (Li & Zhan, KDD 2021) as its first author wrote it (``algorithms/fedrs.py``),
on the clients another reference drew.

FedRepo has no Fashion-MNIST partition of its own that matches the papers' (its ``FedData`` splits
train and test together, 80/20), and FedConcat's table runs FedRS on NIID-Bench's clients. So this
harness draws nothing: it runs on the partitions a NIID-Bench-family harness left in the same results
folder (``DIR/reference/partitions/``, same setting and seed), where FedAvg and MOON from
NIID-Bench's script, and fedray, ran on the very same clients. The wrapper
(`jobs.reference.fedrepo_wrapper`) feeds FedRepo's ``FedRS`` class fedray's data tensors and the
configured model with FedRepo's interface (``encoder``, a bias-free ``classifier``).

What FedRepo's FedRS does that fedray's default does not, and how each run here is set:
- its classifier has no bias (``ClassifyNet``: ``bias=False``): the run must say ``head_bias: false``;
- it clips every local gradient at norm 100 (``max_grad_norm`` in its config.py): fedray does not
  clip; the wrapper keeps FedRepo's 100 (``--max-grad-norm``), recorded with the run;
- a client takes max(local_epochs x batches, 5) steps (a cycling loader, a new shuffle each pass):
  at 2 epochs of batch 64, a client of 65-128 samples takes 5 steps where fedray takes 4, one of at
  most 64 takes 5 where fedray takes 2 (in fidelity_moon's partitions only Dir(0.1) has such
  clients: 2 to 5 per seed, under 1% of the aggregation weight);
- its own Fashion-MNIST pipeline normalises to [-1, 1] (``Normalize((0.5,), (0.5,))``); here both
  sides train on fedray's x / 255, NIID-Bench's scaling, so the two see the same inputs;
- the initial model is drawn after ``torch.manual_seed(seed)`` (FedRepo's ``setup_seed``), fedray's
  from its own stream: the comparison is over seeds, not paired seed by seed;
- the server weighs clients by their sample counts, as fedray does.
"""

from __future__ import annotations

from pathlib import Path

from fedray.config.keys import Config
from jobs.reference import borrowed
from jobs.reference.record import FORCE, Reference, ReferenceError

REPO = "lxcnju/FedRepo"
COMMIT = "617ee01"
MAX_GRAD_NORM = 100.0  # FedRepo's config.py, every data set


def script_args(cfg: Config, out: Path, logdir: Path) -> list[str]:
    """The wrapper's arguments for ``cfg``; ``out`` is the results folder whose reference/partitions/
    hold the clients (a NIID-Bench-family harness drew them there)."""
    hp = borrowed.hparams(cfg, "fedrs", "FedRepo")
    if cfg.head_bias:
        raise ReferenceError(
            "FedRepo's classifier has no bias (networks/basic_nets.py ClassifyNet: bias=False): set head_bias: false"
        )
    return [
        *borrowed.script_args(cfg, out),
        "--alpha",
        f"{hp['alpha']:g}",
        "--max-grad-norm",
        f"{MAX_GRAD_NORM:g}",
    ]


FEDREPO = Reference(
    name="fedrepo",
    repo=REPO,
    commit=COMMIT,
    script="algorithms/fedrs.py",
    wrapper="jobs.reference.fedrepo_wrapper",
    algorithms=frozenset({"fedrs"}),
    args=script_args,
    eval_round=lambda cfg, k: (k + 1, ""),  # FedRepo's test_round: 1, every round
    prepare_data=lambda out: out,  # the data: fedray's data set, and the partitions already in `out`
    about="lxcnju/FedRepo's FedRS, on the partitions a NIID-Bench-family reference drew into --output",
    options=(FORCE,),  # it draws no partitions and its wrapper skips no computation
)
