"""Errors that end a command with exit status 2 (bad input, bad usage)."""


class InputError(Exception):
    """Bad user input: a malformed file, an unknown kernel, a bad option.

    The message is shown to the user as one line and must name the file, field or kernel.
    """
