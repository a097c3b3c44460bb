"""The label-skew baselines: FedAvg and the methods that change its local step or its server step
(FedProx, SCAFFOLD, FedNova, MOON, FedRS, FedLC). Notes: docs/algorithms/baselines.md.
"""
