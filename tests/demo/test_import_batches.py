"""The conversion every OpenMetrics history takes on its way into VictoriaMetrics (the demo's, and the
tests' stores): what goes in and how it is cut."""

from __future__ import annotations

from gpumeter.deploy.demo_clusters import import_batches

HISTORY = """# HELP gpu_up up
# TYPE gpu_up gauge
gpu_up{gpu="0"} 1 1764547200
gpu_up{gpu="0"} 1 1764547215.5

gpu_up{gpu="1",note="a b"} 0 1764547200
# EOF
"""


def test_comments_go_and_seconds_become_milliseconds():
    assert b"".join(import_batches(HISTORY.splitlines(keepends=True))).decode() == (
        'gpu_up{gpu="0"} 1 1764547200000\n'
        'gpu_up{gpu="0"} 1 1764547215500\n'
        'gpu_up{gpu="1",note="a b"} 0 1764547200000\n'
    )


def test_a_batch_closes_once_it_reaches_its_size():
    lines = HISTORY.splitlines(keepends=True)
    batches = list(import_batches(lines, batch_bytes=len('gpu_up{gpu="0"} 1 1764547200\n') * 2))
    assert [batch.count(b"\n") for batch in batches] == [2, 1]
