"""Run the authors' code next to fedray, on the same clients, and import its numbers.

fedray holds no copy of any reference implementation: each harness takes the path of a checkout,
drives the authors' script from outside (a wrapper in this package patches what must change: the
device semantics, writing out its partition, skipping logging-only work), and writes the script's
per-round accuracy into a fedray results folder as runs whose ``source`` is the reference's
repository. `fedray reference NAME CONFIG --checkout PATH --output DIR` runs a sweep config's runs
on the reference, then the same runs in fedray on the reference's own partitions
(``partition: file``), so ``fedray report DIR --cols source,algorithm`` puts them side by side.

References (`jobs.reference.registry.REFERENCES`, each a `jobs.reference.record.Reference`):
``fedconcat`` (sjtudyq/FedConcat, NIID-Bench's experiments.py with FedConcat; FedAvg, FedProx,
SCAFFOLD, FedNova, FedConcat), ``niid-bench`` (Xtra-Computing/NIID-Bench; FedAvg, FedProx, SCAFFOLD,
FedNova, MOON), ``fedrepo`` (lxcnju/FedRepo's FedRS, on the partitions one of those drew),
``fl-bench`` (KarhouTam/FL-bench's FedLC, on such partitions too) and ``fedrc`` (LINs-lab/FedRC: its
FMNIST-C clients from its own generator, as client_files). docs/reference.md says how to add one.
"""
