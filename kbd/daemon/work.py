"""What a daemon runs: one pool of cores and memory shared by every sweep, and the sweeps."""

from __future__ import annotations

import anyio
import anyio.abc

from kbd import protocol
from kbd.protocol import Done, Refused


class Work:
    """The daemon's work: cores, memory budget, active sweeps (supervisor side, no torch)."""

    def __init__(self, cores: list[int], budget: int):
        self.cores = cores
        self.budget = budget

    async def run(self, *, task_status=anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await anyio.sleep_forever()

    def busy(self) -> bool:
        return False

    def status(self) -> dict:
        return {
            "cores": self.cores,
            "free_cores": self.cores,
            "budget": self.budget,
            "reserved": 0,
            "peak_rss_total": 0,
            "templates": {},
            "sweeps": [],
        }

    def stop(self, *, kill: bool) -> None:
        """Start nothing new; with `kill`, kill running kernels too."""

    async def drain(self) -> None:
        """Wait until nothing runs any more."""

    def cancel(self, sweep_id: int, *, kill: bool) -> Done | Refused:
        return Refused(f"no active sweep {sweep_id} in this daemon")

    async def follow(self, sweep_id: int | None, stream: anyio.abc.SocketStream) -> None:
        await stream.send(protocol.encode(Refused("no active sweep in this daemon")))

    async def submit(self, request, stream, frames) -> None:
        await stream.send(protocol.encode(Refused("this daemon does not run sweeps yet")))
