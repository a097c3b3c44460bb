"""Clustering by recursive bipartition: CFL (`cfl.py`, the recursion) and LayerCFL (`layercfl.py`, the
clients compared on selected layers, `layers.py`). Notes: docs/algorithms/splitting.md.
"""
