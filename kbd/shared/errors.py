"""Errors that end a command: bad input (exit status 2), an unusable cluster (exit status 1)."""


class InputError(Exception):
    """Bad user input: a malformed file, an unknown kernel, a bad option.

    The message is shown to the user as one line and must name the file, field or kernel.
    """


class ClusterError(Exception):
    """The cluster cannot run the sweep (unreachable, no usable node, every agent lost); what is
    recorded stays, and the sweep is resumable."""
