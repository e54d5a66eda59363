"""A synthetic, seeded month of a mixed GPU fleet written into a ledger through billing's own APIs
(`billing.allocate.price_gpu_hour` and `Ledger.write_hour`), for the screenshot and `make bench`.

Fleet: 45 % A100-40GB in MIG mode (several layouts), 20 % H100 in MIG mode, 35 % whole H100s held by
one pod or time-sliced by 2-4 pods, plus one unpriced VR200. Tenants: teams of namespaces whose pods
change every day; each MIG instance or GPU is held on a given day with probability 0.85. Pods hold
their device for the whole day, so each (GPU, day) is priced once and its lines re-stamped per hour
(the hours of a day are identical GPU-hours).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from decimal import Decimal

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.models import Allocation, Device, GpuHour, Line, MigInstance
from gpumeter.billing.pricing.base import PriceBook

A100 = "NVIDIA A100-SXM4-40GB"
H100 = "NVIDIA H100 80GB HBM3"
VR200 = "NVIDIA VR200"
A100_LAYOUTS = [
    [("3g.20gb", 3, 4), ("2g.10gb", 2, 2), ("1g.5gb", 1, 1), ("1g.5gb", 1, 1)],
    [("1g.5gb", 1, 1)] * 7,
    [("3g.20gb", 3, 4), ("3g.20gb", 3, 4)],
    [("4g.20gb", 4, 4), ("3g.20gb", 3, 4)],
    [("7g.40gb", 7, 8)],
]
H100_LAYOUTS = [
    [("3g.40gb", 3, 4), ("2g.20gb", 2, 2), ("2g.20gb", 2, 2)],
    [("1g.10gb", 1, 1)] * 7,
    [("4g.40gb", 4, 4), ("3g.40gb", 3, 4)],
]
TEAMS = {
    "ml-research": ["llm-pretrain", "llm-eval", "vision"],
    "search": ["ranking", "embeddings"],
    "ads": ["ads-ctr", "ads-bidding"],
    "recsys": ["recsys-train", "recsys-serve"],
    "speech": ["asr", "tts"],
    "platform": ["ci-gpu", "notebooks"],
    "fraud": ["fraud-models"],
    "robotics": ["sim", "policy"],
    "genai-apps": ["chat-serve", "rag"],
    "data-science": ["ds-notebooks", "forecasting"],
    "security": ["malware-ml"],
    "maps": ["maps-vision"],
}
NAMESPACE_TEAMS = {ns: team for team, namespaces in TEAMS.items() for ns in namespaces}
NAMESPACES = sorted(NAMESPACE_TEAMS)
BOOK = {
    "currency": "USD",
    "versions": [
        {
            "effective_from": "2026-01-01T00:00:00Z",
            "source": "synthetic",
            "sharing_efficiency": {"mig": 1, "time_slicing": "0.9"},
            "utilization_tiers": [
                {"range": [0, 0.3], "efficiency": 0.5},
                {"range": [0.3, 0.7], "efficiency": 0.8},
                {"range": [0.7, 1.0], "efficiency": 1.0},
            ],
            "gpus": {"A100-40GB": {"hourly_rate": "3.00"}, "H100-80GB": {"hourly_rate": "6.88"}},
        }
    ],
}


@dataclass(frozen=True)
class Gpu:
    uuid: str
    model: str
    hostname: str
    index: int
    layout: list  # [(profile, compute, memory)], empty for whole GPUs
    slicing: int  # pods sharing a whole GPU (1 = held alone)


def fleet(gpus: int, seed: int = 7) -> list[Gpu]:
    rng = random.Random(seed)
    out = []
    for i in range(gpus - 1):
        roll = rng.random()
        host, index = f"gpu-node-{i // 8:04d}", i % 8
        uuid = f"GPU-{seed:02d}{i:06d}-0000-4000-8000-{i:012d}"
        if roll < 0.45:
            out.append(Gpu(uuid, A100, host, index, rng.choice(A100_LAYOUTS), 1))
        elif roll < 0.65:
            out.append(Gpu(uuid, H100, host, index, rng.choice(H100_LAYOUTS), 1))
        else:
            out.append(Gpu(uuid, H100, host, index, [], rng.choice([1, 1, 2, 3, 4])))
    out.append(Gpu("GPU-vr200-unpriced-0", VR200, "gpu-node-vr200", 0, [], 1))
    return out


def _day_hour(gpu: Gpu, day: int, start: datetime, rng: random.Random) -> GpuHour:
    hour = start + timedelta(days=day)
    device = Device(gpu.uuid, gpu.model, 3600, gpu.hostname, str(gpu.index), bool(gpu.layout))
    instances, allocations = [], []

    def pod(k: int) -> tuple[str, str]:
        ns = NAMESPACES[rng.randrange(len(NAMESPACES))]
        return ns, f"{ns}-job-{day:02d}-{rng.randrange(10**6):06d}-{k}"

    def util() -> Decimal:
        return Decimal(str(round(rng.betavariate(2, 2.5), 3)))

    if gpu.layout:
        for gi, (profile, compute, memory) in enumerate(gpu.layout):
            gi_id = str(gi + 1)
            instances.append(MigInstance(gpu.uuid, gi_id, profile, compute, memory, 3600, None))
            if rng.random() < 0.85:
                ns, name = pod(gi)
                allocations.append(
                    Allocation(
                        gpu.uuid, ns, name, "main", 3600, Decimal(1), gi_id, profile, "", gpu.hostname, util()
                    )
                )
    else:
        share = (Decimal(1) / gpu.slicing).quantize(Decimal("0.000000001"))
        for k in range(gpu.slicing):
            if rng.random() < 0.85:
                ns, name = pod(k)
                allocations.append(
                    Allocation(gpu.uuid, ns, name, "main", 3600, share, "", "", "", gpu.hostname, util())
                )
    return GpuHour(hour, device, instances, allocations)


def fill(
    ledger,
    book: PriceBook,
    start: datetime,
    days: int,
    gpus: int,
    seed: int = 7,
    progress=None,
    clusters: tuple[str, ...] = ("",),
) -> int:
    """Write ``days`` x 24 hours of the fleet into ``ledger``, in each of ``clusters`` (the same
    fleet in each: a GPU is its cluster and uuid; "": no cluster label); returns the number of lines
    written."""
    rng = random.Random(seed)
    devices = fleet(gpus, seed)
    written = 0
    for day in range(days):
        priced: list[tuple[GpuHour, list[Line]]] = []
        for cluster, gpu in ((cluster, gpu) for cluster in clusters for gpu in devices):
            gh = _day_hour(gpu, day, start, rng)
            if cluster:
                gh = GpuHour(gh.hour, replace(gh.device, cluster=cluster), gh.instances, gh.allocations)
            priced.append((gh, price_gpu_hour(gh, book, NAMESPACE_TEAMS).lines))
        for h in range(24):
            hour = start + timedelta(days=day, hours=h)
            facts = [GpuHour(hour, gh.device, gh.instances, gh.allocations) for gh, _ in priced]
            lines = [Line(**{**line.__dict__, "hour": hour}) for _, ls in priced for line in ls]
            ledger.write_hour(HourRecord(hour, facts, lines, book), source="synthetic")
            written += len(lines)
            if progress:
                progress(hour)
    return written
