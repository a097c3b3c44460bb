"""`python -m jobs.run [CONFIG] [--set k=v ...]`: the same as `fedray run`, for `ray job submit`."""

from __future__ import annotations

import sys

from jobs.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
