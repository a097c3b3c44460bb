"""What an algorithm's check reads of a run (`RunPlan`): the run's shape, not its whole config.

An algorithm ties its hyperparameters to the rest of the run in ``check_run(run, hp)`` (FedConcat's
encoder and classifier rounds against ``rounds``, FedCat's groups against the participants, CFL's
N x N similarities against this machine's memory). What those checks read is here, typed: the
run's scale and schedule, its partition's ground-truth groups, and its model with the data's
shape, so a check can build the model without reading the data. The experiment layer builds it
once the config is checked (`fedray.experiment.checks`); the fields are named as the config
keys they come from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from torch import nn

from fedray.models import build_model

__all__ = ["RunPlan"]


@dataclass(frozen=True)
class RunPlan:
    algorithm: str  # its registered name, for messages
    num_clients: int
    participation: float  # the fraction of clients a round (clients_per_round resolved into it)
    rounds: int
    local_epochs: int
    drop_last: bool
    partition: str
    partition_clusters: int  # the ground-truth groups of a grouped partition (dominant, rotation)
    model: str
    head_bias: bool
    input_shape: tuple[int, ...]  # one sample's shape, from the dataset's info
    num_classes: int

    def build_model(self) -> nn.Module:
        """A fresh model of the run's architecture (its parameters' shapes; the draw is torch's)."""
        return build_model(self.model, self.input_shape, self.num_classes, self.head_bias)

    def trainable_values(self) -> int:
        """The number of trainable parameters of the run's model (what a client's update holds)."""
        return sum(p.numel() for p in self.build_model().parameters() if p.requires_grad)

    def __getattr__(self, name: str) -> object:  # only for names that are not fields
        if name.startswith("__"):  # what copy and pickle look for
            raise AttributeError(name)
        raise AttributeError(
            f"{name!r} is not in an algorithm's view of the run (fedray.algorithms.RunPlan: "
            f"{', '.join(f.name for f in dataclasses.fields(RunPlan))})"
        )
