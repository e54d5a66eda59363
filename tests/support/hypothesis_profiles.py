"""Hypothesis example counts for the two loops: ``loop`` (``make check``, the minute a developer waits)
and ``ci`` (``make test``, where the counts the properties were written for run). Chosen by the
GPUMETER_HYPOTHESIS environment variable; unset means ``ci``, so a run nobody configured is never the
thin one. A test that names its own count writes ``max_examples=examples(300)``: 300 in CI, a tenth in
the loop (at least 20), so the profile decides for it too."""

from __future__ import annotations

import os

from hypothesis import settings

PROFILES = {"loop": 0.1, "ci": 1.0}  # the share of each test's CI count
_VARIABLE = "GPUMETER_HYPOTHESIS"


def chosen() -> str:
    name = os.environ.get(_VARIABLE, "ci")
    if name not in PROFILES:
        raise ValueError(f"{_VARIABLE}={name!r}: expected one of {', '.join(PROFILES)}")
    return name


def examples(ci: int) -> int:
    """The example count for a test written for ``ci`` examples, under the chosen profile."""
    return ci if chosen() == "ci" else max(20, round(ci * PROFILES[chosen()]))


def register() -> None:
    settings.register_profile("ci", deadline=None)
    settings.register_profile("loop", deadline=None, max_examples=examples(100))  # Hypothesis's own 100
    settings.load_profile(chosen())
