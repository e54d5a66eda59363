"""The two errors a caller of gpumeter.web handles: a web config it cannot use, a listen address it cannot bind."""

from __future__ import annotations


class WebConfigError(ValueError):
    """A web config that cannot be used; the message names the file, the field and the value."""


class ListenError(ValueError):
    """A listen address that is malformed, or that cannot be bound (the message names it)."""
