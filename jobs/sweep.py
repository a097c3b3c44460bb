"""`python -m jobs.sweep CONFIG [--set k=v ...]`: the same as `fedray sweep`, for `ray job submit`."""

from __future__ import annotations

import sys

from jobs.cli import main

if __name__ == "__main__":
    sys.exit(main(["sweep", *sys.argv[1:]]))
