"""fedray: federated learning under heterogeneous data, simulated on Ray actors.

The library (this package) never imports ray: every algorithm runs unchanged on the in-process
`LocalFederation` and on the actor-based `actors.RayFederation`.
"""

from __future__ import annotations

__version__ = "0.1.0"
