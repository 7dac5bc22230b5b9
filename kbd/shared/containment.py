"""Containment's vocabulary, shared by both sides: what a record's limits say about it.

A worker contains the kernel it runs (kbd/worker/contain.py): it may write only beneath its
scratch folder (kbd/engine/scratch.py) and the job's extra writable paths, has no network, and
holds no descriptor but its own. It reports each mechanism in its record's limits under the keys
of `KEYS`; a value starting with `NOT_ENFORCED` means the mechanism was missing, with the reason.
"""

from __future__ import annotations

KEYS = ("filesystem", "network")
NOT_ENFORCED = "not enforced: "


def missing(limits: dict[str, str]) -> dict[str, str]:
    """The containment mechanisms a record's limits say were not enforced: key -> reason."""
    return {
        key: limits[key][len(NOT_ENFORCED) :]
        for key in KEYS
        if limits.get(key, "").startswith(NOT_ENFORCED)
    }
