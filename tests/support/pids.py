"""Whether a process the tests started (or left behind) is still running."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie, which has exited and waits for its parent, is not alive."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"
