"""The exposition as Prometheus sees it: golden files, promtool's lint, and a real Prometheus scrape."""

from __future__ import annotations

import math
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gpumeter import contract
from gpumeter.exporter.app import build_exporter
from gpumeter.exporter.catalog import CATALOG, render_markdown
from gpumeter.exporter.config import ExporterConfig
from gpumeter.exporter.snapshot import SnapshotBuilder, UnknownSeries
from gpumeter.simulator.fleet import FLEETS_DIR, load_fleet
from tests.support import loopback
from tests.support.servers import PrometheusServer, require_binary

GOLDEN = Path(__file__).parent / "golden"
# Every node of every example fleet: (fleet, node); a fleet of one node keeps the plain golden name. A rack
# of many alike nodes (gb200-nvl72's 18 trays) is held by its first and last node: the others differ from
# the first only in their UUIDs.
RACK_NODES = 4


def _golden_nodes(nodes):
    return nodes if len(nodes) <= RACK_NODES else [nodes[0], nodes[-1]]


EXAMPLES = [
    (path.stem, node.name)
    for path in sorted(FLEETS_DIR.glob("*.yaml"))
    for node in _golden_nodes(load_fleet(path).nodes)
]
FLEETS = sorted({fleet for fleet, _ in EXAMPLES})


def golden_name(fleet: str, node: str) -> str:
    nodes = [n for f, n in EXAMPLES if f == fleet]
    return f"{fleet}.prom" if len(nodes) == 1 else f"{fleet}.{node}.prom"


ROOT = Path(__file__).parents[2]


# PCIe throughput read beside the sampler (drivers before 555) sees the GPU at whatever moment the read
# ran: the series is there, its value depends on thread timing.
BESIDE_THE_SAMPLER = ("nvidia_gpu_pcie_tx_bytes_per_second{", "nvidia_gpu_pcie_rx_bytes_per_second{")


def stable(text: str) -> str:
    """The exposition without the lines that measure wall time (they differ run to run), and with the
    values read beside the sampler masked."""
    lines = []
    for line in text.splitlines():
        if line.startswith(
            ("gpumeter_exporter_collector_duration_seconds{", "gpumeter_exporter_sample_duration_seconds ")
        ):
            continue
        if line.startswith(BESIDE_THE_SAMPLER):
            line = line.rsplit(" ", 1)[0] + " <varies>"
        lines.append(line + "\n")
    return "".join(lines)


@pytest.mark.parametrize(("fleet", "node"), EXAMPLES)
def test_golden_exposition(simulate, fleet, node, request):
    sim = simulate(fleet, node=node)
    sim.sampler.sample_once()
    sim.sample(5)
    sim.sample(5)
    actual = stable(sim.text())
    golden = GOLDEN / golden_name(fleet, node)
    if request.config.getoption("--update-golden"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(actual)
    assert golden.exists(), f"{golden} missing: run pytest --update-golden once and review the file"
    assert same_exposition(actual, golden.read_text()), (
        f"exposition differs from {golden}; review, then --update-golden"
    )


def same_exposition(actual: str, golden: str) -> bool:
    """The same lines, a sample's value equal to 12 significant digits: Python 3.12 sums floats with
    compensation (sum() is Neumaier's since 3.12), so a simulated counter's last digits differ from
    3.11's; anything else (a name, a label, a line, a value beyond that) is a difference."""
    if actual == golden:
        return True
    ours, theirs = actual.splitlines(), golden.splitlines()
    if len(ours) != len(theirs):
        return False
    for mine, kept in zip(ours, theirs, strict=True):
        if mine == kept:
            continue
        series, _, value = mine.rpartition(" ")
        kept_series, _, kept_value = kept.rpartition(" ")
        try:
            close = math.isclose(float(value), float(kept_value), rel_tol=1e-12)
        except ValueError:
            return False
        if series != kept_series or mine.startswith("#") or not close:
            return False
    return True


@pytest.mark.prometheus
@pytest.mark.parametrize(("fleet", "node"), EXAMPLES)
def test_promtool_finds_nothing_to_report(simulate, fleet, node):
    sim = simulate(fleet, node=node)
    sim.sampler.sample_once()
    sim.sample()
    result = subprocess.run(
        [require_binary("promtool"), "check", "metrics"],
        input=sim.text(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result.stdout + result.stderr
    )


@pytest.mark.parametrize("fleet, node", EXAMPLES)
def test_every_collector_writes_only_the_catalogs_series(simulate, fleet, node, caplog):
    """SnapshotBuilder.add refuses a series the catalog does not declare (or labels of the wrong count),
    and the sampler counts that collector as failed: on every node of every example fleet, every
    collector succeeds, so every series written is one the scrape renders (a misspelt or undeclared
    one used to be written, then silently left out of the exposition)."""
    sim = simulate(fleet, node=node)
    sim.sampler.sample_once()
    snapshot = sim.sample()
    failed = [status.name for status in snapshot.collectors if not status.success]
    assert not failed, f"collectors {failed} failed:\n{caplog.text}"
    assert set(snapshot.series) <= {spec.name for spec in CATALOG}


def test_a_series_the_catalog_lacks_is_refused_where_it_is_written():
    builder = SnapshotBuilder()
    misspelt = replace(contract.POWER, name="nvidia_gpu_pwer_watts")
    with pytest.raises(
        UnknownSeries,
        match=r"nvidia_gpu_pwer_watts is not a series of the exporter's "
        r"catalog .*; did you mean nvidia_gpu_power_watts",
    ):
        builder.add(misspelt, ("0", "GPU-a"), 1.0)
    with pytest.raises(UnknownSeries, match=r"'nvidia_gpu_power_watts' is a str, not a Series"):
        builder.add("nvidia_gpu_power_watts", ("0", "GPU-a"), 1.0)  # type: ignore[arg-type]
    with pytest.raises(UnknownSeries):  # the catalog's name with labels of its own: not the declaration
        builder.add(replace(contract.POWER, labels=("gpu",)), ("0",), 1.0)
    with pytest.raises(ValueError, match=r"^nvidia_gpu_power_watts: 1 label values"):
        builder.add(contract.POWER, ("0",), 1.0)
    with pytest.raises(UnknownSeries):  # billing's series are not the exporter's to write
        builder.add(contract.BILLING_COST, (), 1.0)
    assert builder.series == {}
    builder.add(contract.POWER, ("0", "GPU-a"), 1.0)
    assert builder.series == {"nvidia_gpu_power_watts": [(("0", "GPU-a"), 1.0)]}


def test_docs_metrics_is_generated_from_the_catalog():
    committed = (ROOT / "docs" / "metrics.md").read_text()
    assert committed == render_markdown(), "docs/metrics.md is stale: run `make docs`"


@pytest.mark.prometheus
def test_a_real_prometheus_scrapes_the_exporter(tmp_path):
    exporter = build_exporter(
        ExporterConfig(listen="127.0.0.1:0", simulate="h100-mig", kubelet_socket=None, interval=1)
    ).start()
    try:
        exporter.node.inject("throttle", 2, reason="hw_power_brake")
        exporter.node.inject("nvlink_crc", 1, link=4, count=500)
        target = f"127.0.0.1:{exporter.port}"
        with PrometheusServer(tmp_path, scrape_targets={"gpumeter-exporter": [target]}) as prom:
            up = prom.wait_for('up{job="gpumeter-exporter"} == 1')
            assert up[0]["metric"]["instance"] == target
            temps = prom.wait_for("nvidia_gpu_temperature_celsius", predicate=lambda r: len(r) == 8)
            assert all(20 < float(t["value"][1]) < 95 for t in temps)
            brake = prom.wait_for('nvidia_gpu_clocks_event_active{reason="hw_power_brake"} == 1')
            assert [r["metric"]["gpu"] for r in brake] == ["2"]
            crc = prom.wait_for('nvidia_gpu_nvlink_errors_total{error_type="crc_flit", link="4"} > 0')
            assert crc[0]["metric"]["gpu"] == "1" and float(crc[0]["value"][1]) == 350
            mig = prom.wait_for(
                'nvidia_gpu_mig_memory_used_bytes{gpu="0", gpu_instance_id="7"}'
                " * on(uuid, gpu_instance_id) group_left(mig_uuid) nvidia_gpu_mig_info"
            )
            assert mig[0]["metric"]["mig_profile"] == "1g.10gb" and mig[0]["metric"]["mig_uuid"].startswith(
                "MIG-"
            )
            hosts = prom.query("count by (hostname) (nvidia_gpu_info)")
            assert hosts == [{"metric": {"hostname": "gpu-h100-mig-01"}, "value": hosts[0]["value"]}]
            assert hosts[0]["value"][1] == "8"
    finally:
        exporter.stop()


@pytest.mark.spawns
def test_the_exporter_process_serves_until_sigterm(tmp_path):
    """The console command end to end: serves, answers /healthz, stops cleanly on SIGTERM."""
    import httpx

    from tests.support.servers import free_port

    port = free_port()
    proc = subprocess.Popen(
        [
            str(ROOT / ".venv" / "bin" / "gpumeter"),
            "exporter",
            "--simulate",
            "workstation",
            "--listen",
            f"127.0.0.1:{port}",
            "--kubelet-socket",
            "",
            "--interval",
            "1",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if loopback.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        body = loopback.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        assert "nvidia_gpu_info{" in body and 'hostname="ws-01"' in body
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=15)
    assert proc.returncode == 0, stderr
