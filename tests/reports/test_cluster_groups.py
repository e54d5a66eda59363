"""The chargeback report of a ledger billed from a global store (docs/billing.md §2.3): each group's
top pods under ``--by label:KEY`` where a namespace is shown ``cluster/namespace``, and the unpriced
GPUs counted as (cluster, uuid).

Two hours (h0, h1); A100-40GB at 3.00; NVIDIA VR200 not in the price book:

| cluster | GPU | h0 | h1 |
|---|---|---|---|
| east | GPU-1 A100 | ml-training/trainer | ml-training/trainer |
| east | GPU-2 A100 | research/nb | nothing held |
| west | GPU-1 A100 | ml-training/trainer | nothing held |
| east | GPU-VR VR200 | unpriced | unpriced |
| west | GPU-VR VR200 | unpriced | unpriced |

Labels: ml-training dept=ai, research dept=sci, and west's ml-training alone dept=lab (a
`cluster/namespace` key wins in its cluster). By hand, ``--by label:dept``: ai = east/ml-training's
trainer, 2 h x 3.00 = 6.00; lab = west/ml-training's trainer, 1 h = 3.00; sci = east/research's nb,
1 h = 3.00. Unpriced: VR200, 4 GPU-hours on 2 GPUs (one UUID in two clusters is two GPUs).
Without clusters (east's GPUs alone, cluster ""): ai = ml-training's trainer 6.00, sci = research's nb
3.00; VR200 2 GPU-hours on 1 GPU.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from gpumeter.reports.model import Grouping, build_report, range_period
from tests.billing.factories import A100, HOUR0
from tests.reports.helpers import two_hours

D = Decimal
VR200 = "NVIDIA VR200"
PERIOD = range_period(HOUR0, HOUR0 + timedelta(hours=2))
# (cluster, uuid, model) -> hour -> (namespace, pod) held
GPUS = {
    ("east", "GPU-1", A100): {0: ("ml-training", "trainer"), 1: ("ml-training", "trainer")},
    ("east", "GPU-2", A100): {0: ("research", "nb")},
    ("west", "GPU-1", A100): {0: ("ml-training", "trainer")},
    ("east", "GPU-VR", VR200): {},
    ("west", "GPU-VR", VR200): {},
}
LABELS = {
    "ml-training": {"dept": "ai"},
    "research": {"dept": "sci"},
    "west/ml-training": {"dept": "lab"},
}


def _ledger(tmp_path, clusters: tuple[str, ...]):
    """The hours of ``clusters``' GPUs; ``("",)``: east's GPUs in a store without a cluster label."""
    return two_hours(
        tmp_path,
        {
            ("" if clusters == ("",) else cluster, uuid, model): held
            for (cluster, uuid, model), held in GPUS.items()
            if cluster in clusters or (clusters == ("",) and cluster == "east")
        },
    )


def _groups(report):
    return [
        (row.key, row.usage.cost, [(p.namespace, p.pod, p.usage.cost) for p in row.top_pods])
        for row in report.groups
    ]


@pytest.mark.parametrize(
    ("clusters", "groups", "unpriced"),
    [
        (
            ("east", "west"),
            [
                ("ai", D("6.00"), [("east/ml-training", "trainer", D("6.00"))]),
                ("lab", D("3.00"), [("west/ml-training", "trainer", D("3.00"))]),
                ("sci", D("3.00"), [("east/research", "nb", D("3.00"))]),
            ],
            [(VR200, D(4), 2)],
        ),
        (
            ("",),
            [
                ("ai", D("6.00"), [("ml-training", "trainer", D("6.00"))]),
                ("sci", D("3.00"), [("research", "nb", D("3.00"))]),
            ],
            [(VR200, D(2), 1)],
        ),
    ],
    ids=["clusters", "no-cluster"],
)
def test_each_labels_group_lists_its_top_pods_and_unpriced_gpus_are_cluster_and_uuid(
    tmp_path, clusters, groups, unpriced
):
    ledger = _ledger(tmp_path, clusters)
    try:
        report = build_report(ledger, PERIOD, Grouping.parse("label:dept", LABELS), compare=False)
    finally:
        ledger.close()
    assert _groups(report) == groups
    assert [(u.model, u.gpu_hours, u.gpus) for u in report.unpriced] == unpriced
