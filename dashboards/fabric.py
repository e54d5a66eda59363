"""The NVLink domain row: each NVLink domain's GPUs and their fabric registration and health.

An NVLink domain is what ``nvmlDeviceGetGpuFabricInfoV`` names by its cluster UUID (``nvlink_domain``): a
GB200/GB300 NVL72 rack's 72 GPUs across 18 nodes, or one HGX baseboard. A table of its own so that any
dashboard can carry the row; the fleet overview does. Series: docs/metrics.md (``nvidia_gpu_fabric_*``);
alerts: the ``gpumeter-fabric`` group of alerts/gpumeter-alerts.yaml.
"""

from __future__ import annotations

from gpumeter import contract

from .core import (
    GPU_DETAIL_ROW,
    GPU_INFO,
    MERGE,
    TABLE,
    Panel,
    Query,
    Section,
    color_background,
    on_gpu,
    organize,
    steps,
    value_map,
)

# nvmlGpuFabricInfo_v3's healthSummary as nvidia_gpu_fabric_health_overall carries it
HEALTH = value_map(
    {"1": ("healthy", "green"), "2": ("unhealthy", "red"), "3": ("limited capacity", "orange")}
)


def _fabric_info(selector: str = "") -> str:
    """nvidia_gpu_fabric_info of the GPUs the host variable selects."""
    return (
        f"{contract.FABRIC_INFO.name}{{{selector}}}"
        f' * on(instance, uuid) group_left() {GPU_INFO}{{hostname=~"$hostname"}}'
    )


def _domain_gpus(selector: str = "") -> str:
    return f"count by (nvlink_domain) (group by (nvlink_domain, uuid) ({_fabric_info(selector)}))"


# GPUs per domain (registered, seen, the most in a day) and one row per GPU with its domain, clique,
# registration state and health.
NVLINK_DOMAINS: tuple[Section | Panel, ...] = (
    Section("NVLink domains (the fabric: NVL72 racks, HGX baseboards)"),
    Panel(
        "GPUs per NVLink domain",
        [
            Query(_domain_gpus(), table=True),
            Query(_domain_gpus('state="completed", status="success"'), table=True),
            Query("max_over_time(nvlink_domain:nvidia_gpu_fabric_registered:count[1d])", table=True),
        ],
        kind=TABLE,
        description="Per NVLink domain (its cluster UUID): GPUs that report it, GPUs registered in it, and "
        "the most registered within a day. Registered below the day's most: GpuNvlinkDomainShrank.",
        transformations=[
            MERGE,
            organize(
                exclude=["cluster"],
                rename={"Value #A": "GPUs", "Value #B": "registered", "Value #C": "most in 1d"},
            ),
        ],
        w=10,
        sort_by="GPUs",
    ),
    Panel(
        "GPUs and their fabric state",
        [
            Query(on_gpu(contract.FABRIC_INFO.name), table=True),
            Query(on_gpu(contract.FABRIC_HEALTH_OVERALL.name), table=True),
        ],
        thresholds=steps((None, "transparent")),
        kind=TABLE,
        description="One row per GPU: its NVLink domain and clique, its registration (state; status of a "
        "completed one) and the fabric's summary of its health (Blackwell, driver 570+). A registration "
        "not completed with success: GpuFabricRegistrationIncomplete.",
        links=[GPU_DETAIL_ROW],
        mappings=HEALTH,
        overrides=[color_background("health")],
        transformations=[MERGE, organize(exclude=["uuid", "Value #A"], rename={"Value #B": "health"})],
        w=14,
        sort_by="nvlink_domain",
        ascending=True,
    ),
    Panel(
        "Fabric faults",
        Query(
            on_gpu(
                f'label_replace({contract.FABRIC_REGISTERED.name} == 0, "condition", "not registered", "", "")'
                f" or {contract.FABRIC_HEALTH.name} == 1"
            ),
            table=True,
        ),
        kind=TABLE,
        description="GPUs whose registration is not complete, and the health conditions the fabric "
        "reports (degraded_bw, route_recovery, route_unhealthy, access_timeout_recovery, "
        "incorrect_configuration): GpuFabricHealthDegraded.",
        links=[GPU_DETAIL_ROW],
        transformations=[organize(exclude=["uuid", "Value"])],
        w=24,
        h=6,
    ),
)
