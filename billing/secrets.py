"""Credentials out of what billing prints and stores (docs/security.md).

A URL given with a user and password (``http://user:pass@prometheus:9090``, a ``--db`` URL) or with
a secret in its query (``?password=``, ``?token=``) is shown and kept with the secret replaced by
``xxxxx``, as Go's ``url.URL.Redacted`` writes it (which Prometheus' own logs use)."""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "xxxxx"
# query parameters that carry a secret (libpq's `password`, `sslpassword`; tokens and keys by name)
_SECRET_PARAMETER = re.compile(r"pass|secret|token|key|auth|credential", re.IGNORECASE)
# scheme://user:password@ anywhere in a text (an error message that quotes the URL)
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<user>[^/@:\s]*):(?P<password>[^/@\s]*)@")


def redact_url(text: str) -> str:
    """``text`` (a URL, comma-separated URLs, or a message quoting them) with every password of a
    URL's user info and every secret query parameter replaced by ``xxxxx``."""
    text = _USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:{REDACTED}@", text)
    if "?" not in text:
        return text
    return ",".join(_redact_query(part) for part in text.split(","))


def _redact_query(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.query:
        return url
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if not any(_SECRET_PARAMETER.search(name) for name, _ in pairs):
        return url
    query = urlencode(
        [(name, REDACTED if _SECRET_PARAMETER.search(name) else value) for name, value in pairs], safe="/:"
    )
    return urlunsplit(parts._replace(query=query))
