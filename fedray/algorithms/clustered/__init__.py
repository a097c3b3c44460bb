"""Clustered FL with K cluster models: cluster-wise FedAvg over fixed groups, IFCA, FeSEM and FedSoft,
and the cluster start they share (`groups.py`). Notes: docs/algorithms/clustered.md.
"""
