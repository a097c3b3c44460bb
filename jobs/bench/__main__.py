"""``python -m jobs.bench``: the headline benchmark (`jobs.bench.headline`, ``fedray bench``)."""

from jobs.bench.headline import main

raise SystemExit(main())
