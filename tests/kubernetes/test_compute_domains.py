"""NVIDIA's DRA driver's ComputeDomains (compute-domain.nvidia.com) on a GB200 NVL72 tray: a multi-node job's
pods hold their GPUs through gpu.nvidia.com claims and join the job's NVLink domain through a channel claim.
The GPUs are attributed as any DRA holding is; the channel is no GPU; the domain is a label of the holding
(nvidia_gpu_allocation_dra_info's compute_domain), read from the channel claim's ComputeDomainChannelConfig
as the driver writes it (api/nvidia.com/resource/v1beta1/computedomain.go)."""

from __future__ import annotations

from gpumeter import contract
from gpumeter.exporter.kubelet.attribution import PodAttribution
from gpumeter.exporter.kubelet.client import (
    AllocatableResources,
    ClaimResource,
    ContainerResources,
    DynamicResource,
    PodResources,
)
from gpumeter.exporter.kubernetes import dra
from gpumeter.exporter.kubernetes.dra_cache import DraView
from gpumeter.simulator.fleet import load_fleet
from tests.kubelet.helpers import inventory

NODE = "gb200-nvl72-03"
FLEET = load_fleet("gb200-nvl72")
DOMAIN_UID = "8d0f5c1e-2b7a-4c59-9a43-1f6e2d3c4b5a"  # the ComputeDomain's metadata.uid


def channel_claim(namespace: str, name: str, domain: str) -> dict:
    """A channel ResourceClaim as the driver's ResourceClaimTemplate allocates it."""
    config = {
        "opaque": {
            "driver": dra.COMPUTE_DOMAIN_DRIVER,
            "parameters": {
                "apiVersion": "resource.nvidia.com/v1beta1",
                "kind": "ComputeDomainChannelConfig",
                "domainID": domain,
            },
        }
    }
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"namespace": namespace, "name": name},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "channel",
                            "driver": dra.COMPUTE_DOMAIN_DRIVER,
                            "pool": NODE,
                            "device": "channel-0",
                        }
                    ],
                    "config": [{"source": "FromClass", **config}],
                }
            }
        },
    }


def test_the_domain_is_read_from_the_channel_claims_config_and_nothing_else():
    claim = channel_claim("ml-training", "pretrain-03-channel", DOMAIN_UID)
    assert dra.claim_compute_domain(claim) == DOMAIN_UID
    assert dra.claim_strategies(claim) == {}  # no gpu.nvidia.com device in it
    # a GPU claim with a sharing config names no domain
    gpu_claim = {
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": dra.DRIVER, "pool": NODE, "device": "gpu-0"}],
                    "config": [
                        {
                            "opaque": {
                                "driver": dra.DRIVER,
                                "parameters": {"kind": "GpuConfig", "sharing": {"strategy": "MPS"}},
                            }
                        }
                    ],
                }
            }
        }
    }
    assert dra.claim_compute_domain(gpu_claim) == ""
    assert dra.claim_strategies(gpu_claim) == {(NODE, "gpu-0"): "MPS"}


def _pods() -> tuple[PodResources, ...]:
    """Two containers of the job on this tray: each holds two GPUs through its own gpu.nvidia.com claim and
    joins the domain through its channel claim; a third pod holds a GPU and joins no domain."""
    pods = []
    for i, gpus in enumerate(((0, 1), (2,))):
        resources = tuple(ClaimResource(dra.DRIVER, NODE, f"gpu-{g}") for g in gpus)
        dynamic = [DynamicResource(f"worker-{i}-gpus", "ml-training", resources)]
        dynamic.append(
            DynamicResource(
                f"worker-{i}-channel",
                "ml-training",
                (ClaimResource(dra.COMPUTE_DOMAIN_DRIVER, NODE, "channel-0"),),
            )
        )
        pods.append(
            PodResources(
                "ml-training",
                f"worker-{i}",
                (ContainerResources("trainer", dynamic_resources=tuple(dynamic)),),
            )
        )
    pods.append(
        PodResources(
            "inference",
            "solo",
            (
                ContainerResources(
                    "server",
                    dynamic_resources=(
                        DynamicResource("solo-gpu", "inference", (ClaimResource(dra.DRIVER, NODE, "gpu-3"),)),
                    ),
                ),
            ),
        )
    )
    return tuple(pods)


def test_gpus_of_a_compute_domains_pods_carry_the_domain_and_the_channel_is_no_gpu():
    devices = inventory(FLEET, NODE)
    view = DraView(
        claims={},
        up=True,
        domains={
            ("ml-training", name): dra.claim_compute_domain(channel_claim("ml-training", name, DOMAIN_UID))
            for name in ("worker-0-channel", "worker-1-channel")
        },
    )
    attribution = PodAttribution(None, NODE)
    allocations = attribution.allocations(_pods(), AllocatableResources(), devices, view)
    held = {(a.pod, a.gpu): a for a in allocations}
    # four GPUs held (the channel devices attribute nothing), each by one container, exclusively
    assert sorted(held) == [("solo", 3), ("worker-0", 0), ("worker-0", 1), ("worker-1", 2)]
    assert {a.share for a in allocations} == {1.0} and {a.sharing for a in allocations} == {"exclusive"}
    assert {(a.pod, a.dra.compute_domain) for a in allocations} == {
        ("worker-0", DOMAIN_UID),
        ("worker-1", DOMAIN_UID),
        ("solo", ""),
    }
    labels = dict(
        zip(contract.DRA_ALLOCATION_INFO.labels, held[("worker-1", 2)].dra_labels(NODE), strict=True)
    )
    assert labels["compute_domain"] == DOMAIN_UID and labels["claim_name"] == "worker-1-gpus"
    assert labels["uuid"] == FLEET.node(NODE).gpus[2].uuid
    assert attribution.dra_unresolved == 0

    # without the API (no claim read), the GPUs are still attributed; the domain is unknown, not guessed
    blind = PodAttribution(None, NODE).allocations(_pods(), AllocatableResources(), devices, None)
    assert sorted((a.pod, a.gpu) for a in blind) == sorted(held)
    assert {a.dra.compute_domain for a in blind} == {""}
