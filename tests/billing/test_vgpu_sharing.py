"""docs/billing.md §8 (j): a vGPU host's GPU billed to the VMs that hold its vGPUs. The exporter's
allocation for a vGPU (sharing="vgpu") names the VM by its VM ID as namespace; the team map's `vms:`
section names its team; pricing applies `sharing_efficiency.vgpu` (seed 003's 0.85). Figures by hand."""

from __future__ import annotations

import dataclasses
from decimal import Decimal

import pytest

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.config import ConfigError, load_team_map
from gpumeter.billing.models import UNALLOCATED
from gpumeter.billing.pricing import load_price_book
from tests.billing.factories import H100, alloc, book, gpu_hour, write_book

D = Decimal
SHORTFALL = "__sharing_shortfall__"
RATES = {"H100-80GB": {"hourly_rate": "6.88"}}
# the VM IDs NVML reports on a KVM host (libvirt domain UUIDs)
FINANCE_VM = "0658b9c6-d2e0-ef3a-a1f3-f4c9b27fbd55"
RENDER_VM = "5ce3259a-b9b1-af7c-3dbd-f1b461e0f36a"
SANDBOX_VM = "1829e5cc-8a5b-972f-05e8-57abbb79ba8d"
TEAMS = f"namespaces:\n  ml-train: research\nvms:\n  {FINANCE_VM}: finance\n  {RENDER_VM}: media\n  {SANDBOX_VM}: finance\n"


def _hour():
    """One H100 on a vGPU host, 4 slots of H100XM-20C (share 0.25 each); three VMs hold one each all hour."""
    u = "GPU-vgpu-host"
    allocations = [
        dataclasses.replace(alloc(u, vm, f"vgpu-{i}", share="0.25"), container="", sharing="vgpu")
        for i, vm in enumerate((FINANCE_VM, RENDER_VM, SANDBOX_VM))
    ]
    return gpu_hour(u, H100, allocations=allocations)


# vGPU at 0.85: each VM 0.25 x 6.88 x 0.85 = 1.462 -> 1.46 (remainder 0.2 cent); shortfall
# 0.75 x 6.88 x 0.15 = 0.774 -> 0.77 (0.4 cent); unallocated slot 0.25 x 6.88 = 1.72. Floors sum to
# 4.38 + 0.77 + 1.72 = 6.87: the one cent left goes to the largest remainder, the shortfall's: 0.78.
VGPU_AT_085 = {
    "vgpu-0": D("1.46"),
    "vgpu-1": D("1.46"),
    "vgpu-2": D("1.46"),
    SHORTFALL: D("0.78"),
    UNALLOCATED: D("1.72"),
}


def test_each_vm_pays_its_vgpu_at_the_vgpu_efficiency_and_its_team_comes_from_the_team_map(tmp_path):
    prices = book(tmp_path, RATES, sharing_efficiency={"vgpu": "0.85", "time_slicing": "0.5"})
    teams_file = tmp_path / "teams.yaml"
    teams_file.write_text(TEAMS)
    priced = price_gpu_hour(_hour(), prices, load_team_map(teams_file))
    assert {line.pod or line.namespace: line.amount for line in priced.lines} == VGPU_AT_085
    assert sum(VGPU_AT_085.values()) == D("6.88") == priced.device_cost
    team = {}
    for line in priced.lines:
        if line.pod:
            team[line.team] = team.get(line.team, D(0)) + line.amount
    assert team == {"finance": D("2.92"), "media": D("1.46")}  # 2 x 1.46 and 1.46


def test_without_a_vgpu_efficiency_a_vm_pays_its_whole_share(tmp_path):
    # e = 1: each VM 0.25 x 6.88 = 1.72, the free slot 1.72 unallocated, no shortfall
    prices = book(tmp_path, RATES, sharing_efficiency={"time_slicing": "0.5"})
    amounts = {line.pod or line.namespace: line.amount for line in price_gpu_hour(_hour(), prices).lines}
    assert amounts == {"vgpu-0": D("1.72"), "vgpu-1": D("1.72"), "vgpu-2": D("1.72"), UNALLOCATED: D("1.72")}


def test_the_seed_layout_names_the_vgpu_efficiency(tmp_path):
    doc = {"gpuTypes": [{"name": "h100-80gb", "hourlyCost": 6.88}], "sharingEfficiency": {"vgpu": 0.85}}
    version = load_price_book(write_book(tmp_path, doc, "seed.yaml")).versions[0]
    assert version.efficiency("vgpu") == D("0.85")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vms: [a, b]\n", r"teams.yaml: vms: expected a mapping of VM ID to team \(value \['a', 'b'\]\)"),
        ("vms:\n  vm-1: ''\n", r"teams.yaml: vms.vm-1: expected a team name \(value ''\)"),
        (
            "namespaces:\n  shared: a\nvms:\n  shared: b\n",
            r"teams.yaml: vms.shared: also a namespace of team 'a' \(value 'b'\)",
        ),
    ],
)
def test_a_bad_vms_section_is_refused_naming_file_field_and_value(tmp_path, text, message):
    path = tmp_path / "teams.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_team_map(path)


def test_a_team_map_of_vms_alone_is_accepted(tmp_path):
    path = tmp_path / "teams.yaml"
    path.write_text(f"vms:\n  {RENDER_VM}: media\n")
    assert load_team_map(path) == {RENDER_VM: "media"}
