"""What the doctor and the exporter take from the environment about the node they run on."""

from __future__ import annotations

import socket

from gpumeter.exporter.doctor import this_node
from gpumeter.exporter.nvml import process_is_privileged


def _status(tmp_path, cap_eff: str):
    path = tmp_path / "status"
    path.write_text(f"Name:\tpython3\nUid:\t0\t0\t0\t0\nCapEff:\t{cap_eff}\n")
    return path


def test_privilege_is_cap_sys_admin_not_the_user(tmp_path):
    """The driver asks capable(CAP_SYS_ADMIN) (open-gpu-kernel-modules, nv-linux.h): root with every
    capability dropped, as the shipped DaemonSet runs, gets no MIG instances' XIDs; it was counted
    privileged (the exporter said gpumeter_exporter_mig_xids_visible 1 while they never came)."""
    assert process_is_privileged(_status(tmp_path, "0000000000000000")) is False
    assert process_is_privileged(_status(tmp_path, "0000000000200000")) is True  # bit 21 alone
    assert process_is_privileged(_status(tmp_path, "000001ffffffffff")) is True  # a full root set
    assert process_is_privileged(_status(tmp_path, "00000000001fffff")) is False  # all but bit 21
    assert process_is_privileged(tmp_path / "missing") is False


def test_the_doctor_reads_the_slices_of_node_name_as_the_exporter_does():
    """In a pod without host networking the hostname is the pod's name, which has no ResourceSlices."""
    assert this_node("gpu-1", {"NODE_NAME": "gpu-2"}) == "gpu-1"
    assert this_node(None, {"NODE_NAME": "gpu-2"}) == "gpu-2"
    assert this_node(None, {}) == socket.gethostname()
