"""What CFL and LayerCFL share beside the recursion (`cfl.py`): how clients are compared (`Similarity`: LayerCFL's distances and split check), and
what a round records against the partition's ground-truth groups (`truth_records`: purity and the
gaps of LayerCFL eqs. 21-22), the evaluation and the saved models.

With ground-truth groups (``dominant``, ``rotation``) every round records ``purity`` and the gap of
LayerCFL eqs. 21-22 (``gap``, ``gap_l2`` on the selected layers' updates; ``gap/LAYER`` and
``gap_l2/LAYER`` for every layer: `analysis.layer_gaps` makes them a table; signed, where LayerCFL's
plots show 0 for any negative gap; after a split the clients' updates start from different cluster
models, so the layer study reads a run that does not split), and ``similarity_dims``, the size of
what the similarity is computed on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedray.algorithms import clustering
from fedray.algorithms.evaluation import cluster_model_records, lowest_loss_global, lowest_loss_records
from fedray.algorithms.splitting import geometry
from fedray.federation import Federation
from fedray.records import Record, rec
from fedray.storage.export import SavedModel, cluster_models


@dataclass(frozen=True)
class Similarity:
    """How clients are compared: the distance (`fedray.algorithms.splitting.geometry.DISTANCES`, on the updates or the
    weights of ``SplitState.selected``) and, if ``gamma_max`` is set, the check a split must pass to
    be kept (LayerCFL's Theorem 1)."""

    distance: str = "delta_cos"
    gamma_max: float | None = None

    def halves(
        self,
        members: list[int],
        update: Callable[[int], np.ndarray],
        weights: Callable[[int], np.ndarray],
        cluster: int,
    ) -> tuple[np.ndarray | None, list[Record]]:
        """Cluster ``cluster``'s bipartition (0/1 per member) by its members' updates (``update(c)``)
        or weights (``weights(c)``), as the distance says, or None where the split check rejects it.
        The one matrix a split needs is built, two when the distance is on the weights."""
        moved = geometry.stacked_rows(members, update)
        on = moved if self.distance.startswith("delta") else geometry.stacked_rows(members, weights)
        halves = geometry.bipartition(geometry.pairwise_distances(on, self.distance))
        if self.gamma_max is None:
            return halves, []
        safe, cross_max = geometry.split_is_safe(geometry.cosine_similarity(moved), halves, self.gamma_max)
        records = [rec("alpha_cross_max", cross_max, scope="cluster", entity=cluster)]
        if not safe:  # the theorem does not vouch for this split: roll back, train on unsplit
            return None, [*records, rec("split_rejected", 1, scope="cluster", entity=cluster)]
        return halves, records


def truth_records(
    fed: Federation, state: Any, update: Callable[[int, list[str]], np.ndarray]
) -> list[Record]:
    """purity of the clustering, and the gap (LayerCFL eqs. 21-22) of the updates of every layer and
    of the selected layers (``gap``, ``gap_l2``), against the partition's ground-truth groups, over
    all clients."""
    cids = sorted(fed.client_ids)
    truth = [fed.groups[c] for c in cids]
    assignment = {c: k for k, m in enumerate(state.clusters) for c in m}
    records = [rec("purity", clustering.purity(assignment, fed.groups))]
    if len(set(truth)) < 2:
        return records
    for name, names in [
        ("", state.selected),
        *((f"/{layer}", ps) for layer, ps in state.layer_params.items()),
    ]:
        x = geometry.stacked_rows(cids, lambda c, names=names: update(c, names))
        records += [
            rec(f"gap{name}", geometry.gap_cos(geometry.cosine_similarity(x), truth)),
            rec(f"gap_l2{name}", geometry.gap_l2(geometry.euclidean_distances(x), truth)),
        ]
    return records


def models(state: Any, hp: Any) -> list[SavedModel]:
    return cluster_models(state.models, dict(enumerate(state.clusters)))


def evaluate(state: Any, fed: Federation, hp: Any, rnd: int) -> list[Record]:
    assignment = {c: k for k, m in enumerate(state.clusters) for c in m}
    records = cluster_model_records(fed, state.models, assignment)
    if fed.test_client_ids:
        return records + lowest_loss_records(fed, state.models)
    return lowest_loss_global(records)
