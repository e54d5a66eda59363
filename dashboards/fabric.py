"""The NVLink domain row: each NVLink domain's GPUs and their fabric registration and health.

An NVLink domain is what ``nvmlDeviceGetGpuFabricInfoV`` names by its cluster UUID (``nvlink_domain``): a
GB200/GB300 NVL72 rack's 72 GPUs across 18 nodes, or one HGX baseboard. Its own builder so that any
dashboard can carry the row; the fleet overview does. Series: docs/metrics.md (``nvidia_gpu_fabric_*``);
alerts: the ``gpumeter-fabric`` group of alerts/gpumeter-alerts.yaml.
"""

from __future__ import annotations

from .core import (
    GPU_DETAIL_ROW,
    MERGE,
    Layout,
    PanelSpec,
    Query,
    color_background,
    on_gpu,
    organize,
    steps,
    table_panel,
    value_map,
)

# nvmlGpuFabricInfo_v3's healthSummary as nvidia_gpu_fabric_health_overall carries it
HEALTH = value_map(
    {"1": ("healthy", "green"), "2": ("unhealthy", "red"), "3": ("limited capacity", "orange")}
)


def _fabric_info(selector: str = "") -> str:
    """nvidia_gpu_fabric_info of the GPUs the host variable selects."""
    return (
        f"nvidia_gpu_fabric_info{{{selector}}}"
        ' * on(instance, uuid) group_left() nvidia_gpu_info{hostname=~"$hostname"}'
    )


def _domain_gpus(selector: str = "") -> str:
    return f"count by (nvlink_domain) (group by (nvlink_domain, uuid) ({_fabric_info(selector)}))"


def nvlink_domain_row(layout: Layout) -> Layout:
    """Adds the "NVLink domains" row: GPUs per domain (registered, seen, the most in a day) and one row per
    GPU with its domain, clique, registration state and health."""
    layout.row("NVLink domains (the fabric: NVL72 racks, HGX baseboards)")
    layout.panel(
        table_panel,
        PanelSpec(
            "GPUs per NVLink domain",
            [
                Query(_domain_gpus(), table=True),
                Query(_domain_gpus('state="completed", status="success"'), table=True),
                Query("max_over_time(nvlink_domain:nvidia_gpu_fabric_registered:count[1d])", table=True),
            ],
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
            h=8,
        ),
        sort_by="GPUs",
    )
    layout.panel(
        table_panel,
        PanelSpec(
            "GPUs and their fabric state",
            [
                Query(on_gpu("nvidia_gpu_fabric_info"), table=True),
                Query(on_gpu("nvidia_gpu_fabric_health_overall"), table=True),
            ],
            description="One row per GPU: its NVLink domain and clique, its registration (state; status of a "
            "completed one) and the fabric's summary of its health (Blackwell, driver 570+). A registration "
            "not completed with success: GpuFabricRegistrationIncomplete.",
            links=[GPU_DETAIL_ROW],
            mappings=HEALTH,
            thresholds=steps((None, "transparent")),
            overrides=[color_background("health")],
            transformations=[
                MERGE,
                organize(exclude=["uuid", "Value #A"], rename={"Value #B": "health"}),
            ],
            w=14,
            h=8,
        ),
        sort_by="nvlink_domain",
        desc=False,
    )
    layout.panel(
        table_panel,
        PanelSpec(
            "Fabric faults",
            [
                Query(
                    on_gpu(
                        'label_replace(nvidia_gpu_fabric_registered == 0, "condition", "not registered", "", "")'
                        " or nvidia_gpu_fabric_health_condition == 1"
                    ),
                    table=True,
                )
            ],
            description="GPUs whose registration is not complete, and the health conditions the fabric "
            "reports (degraded_bw, route_recovery, route_unhealthy, access_timeout_recovery, "
            "incorrect_configuration): GpuFabricHealthDegraded.",
            links=[GPU_DETAIL_ROW],
            transformations=[organize(exclude=["uuid", "Value"])],
            w=24,
            h=6,
        ),
    )
    return layout
