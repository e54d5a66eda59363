"""A Prometheus range answer decoded one series at a time.

`orjson.loads` of a whole range answer makes every point a list of a float and a string: ~150 bytes
of Python objects per ~22 bytes of JSON. A 200 MB answer took ingest to 2.9 GB. Here the answer's
series are found in its bytes first (C-speed `bytes.find`), each decoded only when it is read and let
go once `_columns` (billing/ingest/columns.py) has kept its values, so what an answer costs beyond its own bytes
is one series decoded and the columns kept (docs/performance.md, "Memory per MiB of answer").

The scan relies on JSON's escaping: a `"` inside a string is written `\\"`, so `{"metric":`,
`"values":[[` and the `]]` closing a series' points never occur inside a label value. An answer
laid out otherwise (another key order, native histograms) is decoded whole, as before.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson

_RESULT = b'"result":['
_SERIES = b'{"metric":'
_VALUES = b'"values":[['


def matrix_series(content: bytes | bytearray) -> tuple[dict, Iterator[tuple[dict, list]]] | None:
    """(the answer's envelope less its result, an iterator over its series as (labels, points)), or
    None when the answer is not a plain matrix this scan can split (the caller decodes it whole)."""
    start = content.find(_RESULT)
    if start < 0:
        return None
    try:  # everything before the result, closed: status, resultType (and VictoriaMetrics' isPartial)
        envelope = orjson.loads(content[:start] + b'"result":[]}}')
    except orjson.JSONDecodeError:
        return None
    if not isinstance(envelope, dict) or not isinstance(envelope.get("data"), dict):
        return None
    spans = _spans(content, start + len(_RESULT))
    if spans is None:
        return None
    return envelope, _decoded(memoryview(content), spans)


def _spans(content: bytes | bytearray, at: int) -> list[tuple[int, int]] | None:
    """Each series' [start, end) in ``content`` from ``at`` (just inside the result list)."""
    spans: list[tuple[int, int]] = []
    if content[at : at + 1] == b"]":
        return spans
    find = content.find
    while True:
        if not content.startswith(_SERIES, at):
            return None
        values = find(_VALUES, at)
        if values < 0:
            return None
        end = find(b"]]", values)
        if end < 0 or content[end + 2 : end + 3] != b"}":
            return None  # a key after the points (native histograms): not this layout
        spans.append((at, end + 3))
        follows = content[end + 3 : end + 4]
        if follows == b"]":
            return spans
        if follows != b",":
            return None
        at = end + 4


def _decoded(view: memoryview, spans: list[tuple[int, int]]) -> Iterator[tuple[dict, list]]:
    for start, end in spans:
        item = orjson.loads(view[start:end])
        yield item["metric"], item["values"]
