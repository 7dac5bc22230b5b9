"""Sweeps and tunes on a Ray cluster (`kbd sweep --cluster ADDRESS`, `kbd tune --cluster
ADDRESS`, optional extra `kbd[ray]`).

One kbd agent per node (`agent.py`, a Ray actor pinned to its node) owns that node's warm
template, core pinning, memory admission and sandboxing, exactly as a local sweep does. The head
(`head.py`, the `kbd sweep` process) dispatches kernels to agents and stores every record in its
own SQLite store. Ray provides placement, transport, membership and failure detection; kbd is the
only retry authority. `tuning.py` runs each tuning task of `kbd tune` on one node, through the
head's agents. Only `agent.py` and `head.py` import ray (`tuning.py` through `head.py`); this
module does not.
"""

from __future__ import annotations

import importlib.util

from kbd.shared.errors import InputError

RAY_VERSION = "2.60.0"  # the version pinned by the `ray` extra in pyproject.toml


def require_ray() -> None:
    """Fail with one clear line when Ray is not installed (the `ray` extra)."""
    if importlib.util.find_spec("ray") is None:
        raise InputError(
            f"--cluster needs Ray: install kbd with the ray extra (pip install 'kbd[ray]', "
            f"ray=={RAY_VERSION}) on this machine and on every node"
        )
