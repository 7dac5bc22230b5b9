"""kbd's identity (kbd/shared/identity.py): how two identities are compared and phrased.

That a daemon and a cluster agent of the same code report the same identity, and that an edit
changes it, is tested with real processes in test_daemon.py.
"""

from __future__ import annotations

from importlib import metadata

import msgspec

from kbd.shared import identity
from kbd.shared.identity import Identity

OURS = Identity("1234", "3.11.7", "2.13.0+cpu", "20261001", "/here/bin/python")
DAEMON = "{label}: daemon {theirs}, this kbd {ours}"
NODE = "{tool} {theirs} there, {ours} here"


def test_the_same_identity_has_no_differences():
    assert identity.differences(OURS, OURS, DAEMON) == []
    current = identity.current()
    assert identity.differences(current, current, NODE, across_machines=True) == []


def test_each_differing_field_is_phrased_as_the_caller_says():
    theirs = Identity("5678", "3.11.2", "2.12.0", "20261001", "/there/bin/python")
    assert identity.differences(theirs, OURS, DAEMON) == [
        "code hash: daemon 5678, this kbd 1234",
        "python: daemon 3.11.2, this kbd 3.11.7",
        "torch: daemon 2.12.0, this kbd 2.13.0+cpu",
        "interpreter: daemon /there/bin/python, this kbd /here/bin/python",
    ]
    # Another machine: its interpreter's path and Python's patch level do not count.
    assert identity.differences(theirs, OURS, NODE, across_machines=True) == [
        "kbd 5678 there, 1234 here",
        "torch 2.12.0 there, 2.13.0+cpu here",
    ]
    older = msgspec.structs.replace(theirs, python="3.10.14")
    assert "python 3.10.14 there, 3.11.7 here" in identity.differences(
        older, OURS, NODE, across_machines=True
    )


def test_an_identity_without_the_interpreter_decodes_and_is_compared_without_it():
    """A daemon or a bundle of a kbd before `executable` existed."""
    old = msgspec.json.decode(
        b'{"code_hash": "1234", "python": "3.11.7", "torch": "2.13.0+cpu", '
        b'"torch_mlir": "20261001"}',
        type=Identity,
    )
    assert old.executable == ""
    assert identity.differences(old, OURS, DAEMON) == []


def test_versions_are_those_of_the_installed_distributions():
    current = identity.current()
    assert current.torch == metadata.version("torch")
    assert current.torch_mlir == metadata.version("torch-mlir")
    assert identity._version("no-such-distribution-kbd") == "missing"
