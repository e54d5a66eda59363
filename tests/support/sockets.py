"""Socket checks the listener tests share."""

from __future__ import annotations

import socket


def still_open(sock: socket.socket) -> bool:
    """Whether the server has not closed ``sock`` (nothing to read, no end of stream): how a test shows
    by order, not by a clock, that something was served while a connection was still held."""
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)
