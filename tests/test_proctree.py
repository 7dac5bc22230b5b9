"""Process trees and their memory from /proc, checked against psutil on a real tree."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from kbd.shared import proctree

# A child that starts a grandchild in its own session (as a kernel's escapee would), then waits.
TREE = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
    " start_new_session=True)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


def test_descendants_and_their_memory_match_psutil():
    child = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        expected = {p.pid for p in psutil.Process(child.pid).children(recursive=True)}
        assert len(expected) == 1
        assert set(proctree.descendants(child.pid)) == expected
        assert proctree.children(child.pid) == list(expected)
        own = psutil.Process(child.pid).memory_info().rss
        assert abs(proctree.rss(child.pid) - own) < 1 << 20  # sampled a moment apart
        assert proctree.tree_rss(child.pid) > proctree.rss(child.pid) > 0
    finally:
        for pid in proctree.descendants(child.pid):
            psutil.Process(pid).kill()
        child.kill()
        child.wait()
    time.sleep(0.05)
    assert proctree.children(child.pid) == [] and proctree.rss(child.pid) == 0
