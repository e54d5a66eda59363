"""Settings for the simulated exporters the tests start by the hundred."""

from __future__ import annotations

# The XID thread's wait slice (exporter/xid.py WAIT_MS, 100 ms in production): stopping an exporter waits
# out the slice in progress, ~50 ms a test at 100 ms; the driver's calls are the same, only more of them.
XID_WAIT_MS = 10
