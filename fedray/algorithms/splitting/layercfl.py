"""LayerCFL (2023; no public code; docs/algorithms/splitting.md#layercfl, docs/algorithms/splitting.md#d2-which-layers-layercfl-compares): CFL's recursive bipartition
(`cfl.py`, `fedray.algorithms.splitting.cfl`) with the clients compared on the updates of selected layers only.

The layers are chosen in advance for the environment (``layers``): ``conv`` (the convolutions) for
feature skew such as rotated clients, ``fc`` (the first fully connected layer) for label skew,
``conv:I`` / ``fc:I`` one layer by its place (the paper names one: VGG-16's 4th layer is ``conv:4``),
``auto`` (the default: ``conv`` where the model has convolutions, else ``fc``, so every model runs),
``all`` for CFL's behaviour, or a list of regular expressions on parameter names
(``["features\\\\.7\\\\."]``). A layer is one module's weight and
bias (docs/algorithms/splitting.md#what-a-layer-is). The split condition is CFL's: the cluster's mean update over all parameters below
``eps1`` (eq. 27) and the largest member update on the selected layers above ``eps2`` (eq. 28). The
distance (eqs. 23-26) is ``delta_cos`` (LayerCFL's own, eq. 26) by default, or ``delta_l2``, ``cos`` or
``l2`` (of the weights). With ``check_split`` a split is kept only when it passes Theorem 1 (eq. 20,
CFL's separation theorem): gamma_max < sqrt((1 - alpha_cross_max) / 2), alpha_cross_max the largest
cosine similarity of the selected layers' updates across the two halves and ``gamma_max`` the bound
on the clients' relative gradient noise, which the paper leaves to the user (its gamma_i in [0, 1)
needs the true risk); otherwise the split is rolled back (a ``split_rejected`` row) and the cluster
trains on. Every checked split records its ``alpha_cross_max``. ``similarity_dims`` records the size of what
the similarity is computed on, against CFL's whole model.

Deviation, said openly: the printed aggregation formula is illegible (docs/algorithms/splitting.md#decisions-where-the-papers-are-silent); we use CFL's
n_i-weighted average, so LayerCFL with ``layers: all``, ``check_split: false`` is CFL exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fedray.algorithms.plan import RunPlan
from fedray.algorithms.splitting import cfl
from fedray.algorithms.splitting.cfl import (  # noqa: F401 - CFL's evaluation and saved models
    SplitHparams,
    SplitState,
    evaluate,
    init_state,
    models,
)
from fedray.algorithms.splitting.geometry import DISTANCES
from fedray.algorithms.splitting.layers import PRESETS, is_preset, select
from fedray.algorithms.splitting.measures import Similarity
from fedray.algorithms.splitting.scale import check_participation, check_size
from fedray.config.hparams import bound, one_of
from fedray.federation import Federation
from fedray.records import Record

State = SplitState  # CFL's: the clusters, their models, the layers, the split history


def check_run(run: RunPlan, hp: Hparams) -> None:
    """CFL's checks, and ``hp.layers`` against the configured model, before any actor starts."""
    check_participation(run)
    check_size(run)  # the updates travel whole; the similarity reads some layers
    select(run.build_model(), hp.layers)


@dataclass
class Hparams(SplitHparams):
    # auto | conv | fc | conv:I | fc:I | all | regular expressions on parameter names
    layers: str | list[str] = field(default="auto")
    # delta_cos (eq. 26) | delta_l2 (eq. 24) | cos (eq. 25) | l2 (eq. 23)
    distance: str = field(default="delta_cos", metadata=one_of(*DISTANCES))
    check_split: bool = True  # keep a split only if Theorem 1 vouches for it, else roll back
    # Theorem 1's bound on the relative gradient noise: split iff alpha_cross_max < 1 - 2 gamma_max^2
    gamma_max: float = field(default=0.5, metadata=bound(ge=0, lt=1))

    def check(self) -> None:
        if isinstance(self.layers, str) and not is_preset(self.layers):
            raise ValueError(
                f"config key 'hp.layers': one of {', '.join(PRESETS)}, conv:I, fc:I or a list of patterns, "
                f"got {self.layers!r}"
            )


def init(fed: Federation, hp: Hparams) -> State:
    return init_state(fed, hp.layers)


def round(state: State, fed: Federation, hp: Hparams, rnd: int) -> tuple[State, list[Record]]:  # noqa: A001
    return cfl.round(state, fed, hp, rnd, Similarity(hp.distance, hp.gamma_max if hp.check_split else None))
