"""Errors that end a command: bad input (exit status 2), a worker template or cluster that cannot
run kernels (exit status 1)."""


class InputError(Exception):
    """Bad user input: a malformed file, an unknown kernel, a bad option.

    The message is shown to the user as one line and must name the file, field or kernel.
    """


class TemplateError(Exception):
    """The template process died or misbehaved; the command cannot start more workers."""


class ClusterError(Exception):
    """The cluster cannot run the sweep (unreachable, no usable node, every agent lost); what is
    recorded stays, and the sweep is resumable."""


def fatal_error(exc: BaseException) -> BaseException:
    """The TemplateError or ClusterError inside `exc` (maybe a group); re-raises anything else."""
    if isinstance(exc, BaseExceptionGroup):
        found, _ = exc.split((TemplateError, ClusterError))
        if found is None:
            raise exc
        exc = found.exceptions[0]
        while isinstance(exc, BaseExceptionGroup):
            exc = exc.exceptions[0]
    return exc
