"""Run LINs-lab/FedRC's FMNIST-C generator (``create_c/make_fmnist_c.py``) unchanged, seeded, with
today's libraries. Run by `jobs.reference.fedrc` under the reference's own Python (it needs Wand and
ImageMagick, OpenCV, scikit-image, SciPy, torchvision), in a working folder that holds
``data/fmnist-c/origin/FashionMNIST/raw/`` (the IDX files); the script writes
``data/fmnist-c/{0..299}.pkl`` and ``test-{1,2,3}.pkl`` there.

What this wrapper changes, from outside, and why:

- the script seeds nothing (Python's ``random``, NumPy's and torch's global generators draw the
  label-skewed clients, the roles and each client's corruption and severity): they are seeded here
  with ``--seed``, so the same seed gives the same clients;
- ``numpy.int`` (removed in NumPy 1.24; the dotted_line and zigzag corruptions use it) is put back
  as ``int``, which it was an alias of;
- scikit-image's ``gaussian(..., multichannel=True)`` (removed in 0.20; glass_blur uses it) is
  given its replacement ``channel_axis=-1``;
- torch's distributions do not check their arguments, as before torch 1.8: once a class has no
  images left, the script's Dirichlet(1.0 * class frequencies) has a zero concentration, which
  samples that class with probability about 1e-38 (what the script wants: its reweight() then
  drops the class) and which today's check refuses.

Nothing of fedray is imported: this file runs in the reference's environment.
"""

from __future__ import annotations

import argparse
import functools
import random
import runpy
import sys
from pathlib import Path


def shim_libraries() -> None:
    import numpy as np
    import skimage.filters

    if not hasattr(np, "int"):
        np.int = int  # the alias NumPy had until 1.24
    gaussian = skimage.filters.gaussian

    @functools.wraps(gaussian)
    def gaussian_multichannel(image, *args, multichannel=None, **kwargs):
        if multichannel is not None and "channel_axis" not in kwargs:
            kwargs["channel_axis"] = -1 if multichannel else None
        return gaussian(image, *args, **kwargs)

    skimage.filters.gaussian = gaussian_multichannel  # the script imports it by name after this
    import torch.distributions

    torch.distributions.Distribution.set_default_validate_args(False)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkout", required=True, type=Path, help="the LINs-lab/FedRC checkout")
    p.add_argument("--seed", type=int, default=0, help="seeds random, numpy.random and torch")
    args = p.parse_args(argv)
    script = args.checkout / "create_c" / "make_fmnist_c.py"
    if not script.is_file():
        print(f"fedrc_generate: {script} does not exist (not a LINs-lab/FedRC checkout?)", file=sys.stderr)
        return 2
    import numpy as np
    import torch

    shim_libraries()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    sys.path.insert(0, str(script.parent))
    Path("data/fmnist-c").mkdir(parents=True, exist_ok=True)
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
