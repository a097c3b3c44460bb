"""Clustered sampling (CluSamp): FedAvg whose participants are drawn one from each stratum
(`strata.py`). Notes: docs/algorithms/fedcat.md (the FedCat paper's sampling baseline).
"""
