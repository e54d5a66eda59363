"""A fractional grant counts from the moment its device plugin applied it, as a whole-GPU pod does.

The scheduler writes a HAMi or gpushare grant on the pod while it is still Pending; the device plugin
applies it when the kubelet admits the pod (HAMi `hami.io/bind-phase: allocating` → `success`, gpushare
`ALIYUN_COM_GPU_MEM_ASSIGNED: "false"` → `"true"`). Before, a pending HAMi pod held 0.30 of GPU 0 and
a pending gpushare pod 8/79 of GPU 1 in `nvidia_gpu_allocation` (and were billed for them), while a
whole-GPU pod in the same state held nothing. Now such a grant is a reservation
(`nvidia_gpu_reservation`, for the capacity rules), and an allocation once the annotation says it is
applied or the kubelet lists the container. Same node, stand-ins and hand-worked fractions as
tests/kubernetes/test_fractional.py.
"""

from __future__ import annotations

import pytest

from gpumeter import contract
from tests.kubernetes.test_fractional import EXPECTED, _by_container, running  # noqa: F401

PENDING = {("research", "notebook"), ("nlp", "tagger")}  # a HAMi pod and a gpushare pod
PENDING_CONTAINERS = {("research", "notebook", "jupyter"), ("nlp", "tagger", "server")}


def test_grants_not_yet_applied_are_reservations_held_by_no_one(running):  # noqa: F811
    r = running()
    r.api.binding |= PENDING  # written by the scheduler, not applied: the pods are Pending
    r.kubelet.admitting |= PENDING  # and not in the kubelet's list
    series = r.sample()
    allocations = _by_container(series[contract.ALLOCATION.name])
    assert set(allocations) == set(EXPECTED) - PENDING_CONTAINERS
    assert set(_by_container(series[contract.ALLOCATION_MEMORY.name])) == set(EXPECTED) - PENDING_CONTAINERS
    reservations = _by_container(series[contract.RESERVATION.name])
    assert set(reservations) == PENDING_CONTAINERS
    for key in PENDING_CONTAINERS:
        labels, value = reservations[key]
        assert value == pytest.approx(EXPECTED[key][3])  # its compute fraction: 0.30, and 8/79
        assert labels["sharing"] == "fractional" and labels["gpu"] == EXPECTED[key][1]
    # the others keep their grants exactly
    for key, (_, value) in allocations.items():
        assert value == pytest.approx(EXPECTED[key][3])


def test_a_grant_counts_once_its_annotation_says_applied_or_the_kubelet_lists_it(running):  # noqa: F811
    r = running()
    r.api.binding |= PENDING
    r.kubelet.admitting |= PENDING
    r.sample()

    r.kubelet.admitting.clear()  # the kubelet admitted them; the annotations not yet rewritten
    series = r.sample()
    assert set(_by_container(series[contract.ALLOCATION.name])) == set(EXPECTED)
    assert series[contract.RESERVATION.name] == []

    r.api.binding.clear()  # the device plugin applied them: bind-phase success, ASSIGNED "true"
    r.kubelet.admitting |= PENDING  # even with the kubelet's list behind
    series = r.sample()
    allocations = _by_container(series[contract.ALLOCATION.name])
    assert set(allocations) == set(EXPECTED)
    for key in PENDING_CONTAINERS:
        assert allocations[key][1] == pytest.approx(EXPECTED[key][3])
        assert allocations[key][0]["sharing"] == "fractional"
    assert series[contract.RESERVATION.name] == []
