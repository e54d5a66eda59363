"""Listen addresses: ``host:port``, ``:port`` and ``[v6]:port``, and whether a host is this machine only."""

from __future__ import annotations

import ipaddress

from .errors import ListenError


def parse_listen(text: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """``host:port``, ``:port`` (every interface) or ``[v6]:port`` -> (host, port)."""
    host, colon, port = str(text).strip().rpartition(":")
    if not colon:
        raise ListenError(f"{text!r}: expected host:port or :port")
    if host.startswith("[") != host.endswith("]"):
        raise ListenError(f"{text!r}: unbalanced brackets around the IPv6 address")
    host = host[1:-1] if host.startswith("[") else host
    if not port.isascii() or not port.isdigit() or int(port) > 65535:
        raise ListenError(f"{text!r}: the port must be a number from 0 to 65535")
    return host or default_host, int(port)


def is_loopback(host: str) -> bool:
    """Whether only this machine can reach ``host`` (an empty host means every interface)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
