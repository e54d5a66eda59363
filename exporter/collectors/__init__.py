"""Collectors: one file per area of NVML, node_exporter style.

A collector reads NVML for one device at sampling time and adds samples to the cycle's snapshot
builder; it never runs during a scrape. Its optional hooks:

- ``discover(device)``: read facts that never change (thresholds, max clocks, link count) once;
- ``fields(device)``: field-value IDs it needs, batched by the sampler into one
  ``nvmlDeviceGetFieldValues`` call per device per cycle;
- ``update(device, out)``: add this cycle's samples;
- ``close()``: end work it runs beside the cycle, called by the sampler's ``stop()`` before NVML is
  given back (a call after the last ``nvmlShutdown`` is refused, docs/nvml.md §12).

The sampler times each collector and publishes ``gpumeter_exporter_collector_success`` and
``..._duration_seconds`` for it. Collectors register themselves with :func:`register_collector`;
:func:`build` picks the enabled ones (``--enable-collectors`` / ``--disable-collectors``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from ..nvml import DeviceContext
from ..snapshot import SnapshotBuilder

__all__ = ["Collector", "available", "build", "register_collector"]


class Collector(Protocol):
    name: str

    def update(self, device: DeviceContext, out: SnapshotBuilder) -> None: ...


_FACTORIES: dict[str, tuple[Callable[..., Collector], bool]] = {}


def register_collector(name: str, default_enabled: bool = True):
    def register(factory):
        factory.name = name
        _FACTORIES[name] = (factory, default_enabled)
        return factory

    return register


def available() -> dict[str, bool]:
    """Collector names, in run order, with whether each is on by default."""
    return {name: default for name, (_, default) in _FACTORIES.items()}


def build(
    enabled: Iterable[str] = (), disabled: Iterable[str] = (), disable_defaults: bool = False, **deps
) -> list[Collector]:
    enabled, disabled = set(enabled), set(disabled)
    unknown = (enabled | disabled) - set(_FACTORIES)
    if unknown:
        raise ValueError(
            f"unknown collector(s): {', '.join(sorted(unknown))}; known: {', '.join(_FACTORIES)}"
        )
    chosen = []
    for name, (factory, default) in _FACTORIES.items():
        on = name in enabled or (default and not disable_defaults and name not in disabled)
        if on:
            chosen.append(factory(**{k: v for k, v in deps.items() if k in getattr(factory, "needs", ())}))
    return chosen


# Run order matters: "mig" enumerates the instances that "processes" and "profiling" read; "nvlink" discovers the link
# count "nvlink_traffic" reads.
from . import (  # noqa: E402
    clocks,  # noqa: F401
    clocks_event,  # noqa: F401
    ecc,  # noqa: F401
    fabric,  # noqa: F401
    memory,  # noqa: F401
    mig,  # noqa: F401
    nvlink,  # noqa: F401
    nvlink_traffic,  # noqa: F401
    pcie,  # noqa: F401
    power,  # noqa: F401
    processes,  # noqa: F401
    profiling,  # noqa: F401
    thermal,  # noqa: F401
    utilization,  # noqa: F401
    vgpu,  # noqa: F401
    video,  # noqa: F401
    xid,  # noqa: F401
)
