"""Contain the kernel a worker is about to run: filesystem, network, temporary files.

Applied once, right after the job arrives and while the worker is still single-threaded
(namespaces and Landlock bind the calling thread and what it starts later):

- filesystem: Landlock makes everything read-only (levels files, the home folder, the
  repository) except the worker's scratch folder, the job's extra writable paths and a few
  harmless device files, and the job's hidden paths (the results store) not even readable;
- network: a fresh network namespace (loopback down, no other device), a seccomp filter that
  denies socket(2), and Landlock's TCP bind/connect denial; any one of them is enough to
  stop a kernel reaching a network, each is applied where the kernel allows and recorded;
- temporary files go to the scratch folder (TMPDIR and friends).

The template already closed every descriptor but the worker's own before this runs.
Whatever is missing is reported as `not enforced: <reason>`, never silently skipped.
"""

from __future__ import annotations

import os

from kbd.shared.containment import NOT_ENFORCED
from kbd.shared.protocol import Limits
from kbd.worker import landlock, sandbox, seccomp


def contain(limits: Limits) -> dict[str, str]:
    """Apply the job's containment; returns the record's `filesystem` and `network` entries."""
    if limits.scratch:
        sandbox.use_scratch(limits.scratch)
    if not limits.sandbox:
        off = NOT_ENFORCED + "turned off (--no-sandbox)"
        return {"filesystem": off, "network": off}
    if sandbox.threads() != 1:  # would leave other threads unconfined
        reason = NOT_ENFORCED + f"worker has {sandbox.threads()} threads before containment"
        return {"filesystem": reason, "network": reason}
    network: list[str] = []
    missing: list[str] = []
    try:
        network.append(sandbox.isolate_network() + " (no device up)")
    except OSError as exc:
        missing.append(exc.strerror)
    writable = [p for p in (limits.scratch, *limits.writable) if p]
    files = [p for p in sandbox.WRITABLE_FILES if os.path.exists(p)]
    try:
        applied = landlock.restrict(writable, files, list(limits.hidden))
        filesystem = applied.describe_fs()
        if applied.net:
            network.append("landlock TCP bind/connect denied")
    except OSError as exc:
        filesystem = NOT_ENFORCED + exc.strerror
        missing.append(exc.strerror)
    try:
        seccomp.deny_sockets()
        network.append("seccomp socket() denied")
    except OSError as exc:
        missing.append(exc.strerror)
    if not network:
        return {"filesystem": filesystem, "network": NOT_ENFORCED + "; ".join(missing)}
    unavailable = f" (unavailable: {'; '.join(missing)})" if missing else ""
    return {"filesystem": filesystem, "network": ", ".join(network) + unavailable}
