"""FedConcat's stage 2 by a clustered-FL algorithm (the FedConcat paper's Table 10: FedConcat-IFCA,
-FeSEM, -FedSoft): the algorithm ``hp.clustering`` runs its own rounds, clustering as it trains,
with its defaults and K clusters; its cluster models become the encoders, each client in the
cluster its ``assignment(state)`` hook names.

``clustering``: ``kmeans`` is the paper's stage 1 (label distributions, then fixed clusters); ``ifca``,
``fesem`` or ``fedsoft`` run stage 2 as that clustered algorithm instead (its own inits, K clusters,
its other hyperparameters at their defaults), clustering while training, and its K cluster models
become the encoders (the FedConcat paper's Table 10 variants, built from our IFCA / FeSEM / FedSoft:
FC's own FeSEM script differs, docs/algorithms/clustered.md#d6-fedconcats-own-ifca-and-fesem-scripts: equal consecutive groups in round 0, squared-L2 assignment
to the previous local model; and the K models start from distinct inits, not docs/algorithms/fedconcat.md#d5-one-initialisation-for-every-cluster's
identical one). ``balanced``, ``eps`` and ``elbow_range`` apply to ``kmeans`` only.
"""

from __future__ import annotations

from dataclasses import replace
from types import ModuleType
from typing import Any

from fedray.algorithms.clustered import fedsoft, fesem, ifca
from fedray.algorithms.concat import ENCODER, staged
from fedray.federation import Federation
from fedray.records import Record
from fedray.storage.export import SavedModel

# Stage 1 is K-means on the clients' label distributions (``clustering: kmeans``). Or a clustered-FL
# algorithm runs stage 2 itself, clustering as it trains (FedConcat-IFCA, -FeSEM, -FedSoft: the
# FedConcat paper's Table 10); its K cluster models become the encoders, each client in the cluster
# its `assignment(state)` hook names (IFCA, FeSEM and FedSoft offer the hook).
CLUSTERED_STAGES: dict[str, ModuleType] = {"ifca": ifca, "fesem": fesem, "fedsoft": fedsoft}


def clustered_stage(state: Any, fed: Federation, hp: Any, rnd: int, stage: str) -> tuple[Any, list[Record]]:
    """Stage 2 as one round of the clustered algorithm ``hp.clustering`` (its defaults, K clusters);
    the encoders are its cluster models, each client in the cluster the algorithm's ``assignment``
    hook names (IFCA, FeSEM: its latest choice; FedSoft: its most important)."""
    alg = CLUSTERED_STAGES[hp.clustering]
    inner_hp = alg.Hparams(num_clusters=hp.num_clusters)
    inner, records = alg.round(state.inner or alg.init(fed, inner_hp), fed, inner_hp, rnd)
    new = replace(
        state,
        inner=inner,
        models=list(inner.models),
        assignment=alg.assignment(inner),
        stage=stage,
    )
    return new, staged(records, ENCODER)


def evaluate(state: Any, fed: Federation, hp: Any, rnd: int) -> list[Record]:
    alg = CLUSTERED_STAGES[hp.clustering]
    return staged(alg.evaluate(state.inner, fed, alg.Hparams(num_clusters=hp.num_clusters), rnd), ENCODER)


def models(state: Any, hp: Any) -> list[SavedModel]:
    """Mid-stage-2, the clustered algorithm's models."""
    return CLUSTERED_STAGES[hp.clustering].models(state.inner, hp)
