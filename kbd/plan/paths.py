"""Output paths from the command line, checked before any work starts.

A command that would only fail at its end, writing a JUnit file into a folder that cannot exist
or logs under a regular file, is refused at its start instead: nothing has run and nothing was
stored, and the message names the option and the path (an InputError: exit status 2).
"""

from __future__ import annotations

import os
from pathlib import Path

from kbd.shared.errors import InputError


def check_output(
    path: str | Path | None, option: str | None, *, folder: bool = False, write: bool = True
) -> None:
    """Raise InputError unless `path` can be a file (a folder with `folder`) that this process
    creates or overwrites, with any missing folders on its way (the writers create them).

    `option` (e.g. "--junit") starts the message; None names the path alone. With `write`
    False only the kinds of the path and its nearest existing ancestor are checked, not the
    permissions (for a file that is also read, such as the results database)."""
    if path is None:
        return
    if not str(path).strip():
        raise InputError(f"{option}: empty path")
    where = f"{option} {path}" if option else str(path)
    absolute = Path(os.path.abspath(path))
    existing = absolute
    while not os.path.exists(existing):  # False on any error, e.g. ENOTDIR under a file
        existing = existing.parent
    if existing == absolute:
        if absolute.is_dir() and not folder:
            raise InputError(f"{where}: is a folder, expected a file")
        if folder and not absolute.is_dir():
            raise InputError(f"{where}: is a file, expected a folder")
    elif not existing.is_dir():
        raise InputError(f"{where}: cannot be created, {existing} is a file and not a folder")
    mode = os.W_OK | os.X_OK if existing.is_dir() else os.W_OK
    if write and not os.access(existing, mode):
        raise InputError(f"{where}: cannot be written ({existing}: permission denied)")
