"""`python -m jobs.tune FILE [--set k=v ...]`: the same as `fedray tune`, for `ray job submit`."""

from __future__ import annotations

import sys

from jobs.cli import main

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))
