"""A fedray plug-in dataset with a setting of its own: scikit-learn's digits, their pixels blurred
by Gaussian noise of a standard deviation the config chooses (``data.noise``, in grey levels of
0..16). With ``data.noise: 0`` it is fedray's ``digits`` exactly, sample for sample (its reduces-to
test: tests/front/test_plugins.py).

Its settings are a dataclass given to ``DatasetKind(settings=...)``, declared as an algorithm
declares its ``hp.`` keys: fedray reads them under ``data:``, checks each value against its type
and bound (``--set data.noise=-1`` is refused naming ``data.noise``), refuses a key it does not
have, and puts them in the run id.

    fedray run --plugin examples/plugin/noisy_digits.py --set dataset=noisy_digits --set data.noise=4
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import fedray  # every name a plug-in needs is fedray's own (docs/extending.md#what-is-stable)


@dataclass(frozen=True)
class Settings:
    # the noise's standard deviation, in grey levels (0 = fedray's digits as they are)
    noise: float = field(default=2.0, metadata=fedray.bound(ge=0))
    # the seed of the noise drawn (the same for every run: the data is part of the problem)
    noise_seed: int = field(default=0, metadata=fedray.bound(ge=0))


def load(section: fedray.DataSection) -> fedray.Dataset:
    """fedray's digits (its fixed 70/30 split), each pixel plus N(0, noise^2), clipped to 0..16."""
    digits = fedray.load_dataset(fedray.Config(dataset="digits").data_section)
    s = fedray.data_settings(section)
    rng = np.random.default_rng(s.noise_seed)

    def noisy(part: fedray.ArrayDataset) -> fedray.ArrayDataset:
        if s.noise == 0:
            return part
        x = part.x.astype(np.float32) + rng.normal(0, s.noise, part.x.shape).astype(np.float32)
        return fedray.ArrayDataset(np.clip(x, 0, 16), part.y)

    return fedray.Dataset("noisy_digits", noisy(digits.train), noisy(digits.test), digits.spec)


fedray.register_dataset(
    fedray.DatasetKind(
        "noisy_digits", load, lambda section: fedray.DatasetInfo((1, 8, 8), 10, 1257), settings=Settings
    )
)
