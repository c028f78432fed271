"""dynlab's error for bad input.

:class:`DynlabInputError` marks a problem with what the user gave (an unknown model,
group, study or preset; an impossible length; a broken config, checkpoint or study
folder): the message is one line that names the value and the allowed values.  The
command line prints that line and exits with code 2, having written nothing.  Any other
exception is a bug in dynlab (or a failing machine: a full disk), and the command line
says so (``DYNLAB_DEBUG=1`` shows the traceback).

It subclasses :class:`ValueError`, so code that catches ``ValueError`` (and pydantic
validators, which turn a ``ValueError`` into a validation error) keeps working.
"""

from __future__ import annotations

__all__ = ["DynlabInputError"]


class DynlabInputError(ValueError):
    """Bad input from the user: one line naming the value and what is allowed."""
