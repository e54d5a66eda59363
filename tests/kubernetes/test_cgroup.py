"""A process's pod and container from /proc/<pid>/cgroup: both cgroup versions, both kubelet cgroup
drivers, three runtimes, Guaranteed pods, host processes and processes that are gone. A directory of
files stands in for /proc (the exporter's --proc-root)."""

from __future__ import annotations

import pytest

from gpumeter.exporter.kubernetes.cgroup import ContainerRef, PodIndex, container_of, parse_cgroup

UID = "6b3c1a52-4f0e-4c1e-9d7a-2f5e8c9b0a11"
U_ = UID.replace("-", "_")
CID = "4f1d2c3b" * 8  # 64 hex

LAYOUTS = {
    "v2 systemd containerd": f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/cri-containerd-{CID}.scope\n",
    "v2 cgroupfs": f"0::/kubepods/burstable/pod{UID}/{CID}\n",
    "v2 systemd cri-o": f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{U_}.slice/crio-{CID}.scope\n",
    "v2 guaranteed": f"0::/kubepods.slice/kubepods-pod{U_}.slice/cri-containerd-{CID}.scope\n",
    "v1 cgroupfs": (
        f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n"
        f"4:memory:/kubepods/besteffort/pod{UID}/{CID}\n"
        "1:name=systemd:/kubepods/besteffort\n"
    ),
    "v1 systemd docker": (
        f"11:devices:/kubepods.slice/kubepods-pod{U_}.slice/docker-{CID}.scope\n"
        f"3:cpu,cpuacct:/kubepods.slice/kubepods-pod{U_}.slice/docker-{CID}.scope\n"
    ),
    "hybrid: v1 lines and an empty v2 line": (f"5:memory:/kubepods/burstable/pod{UID}/{CID}\n0::/\n"),
    "nested cgroup inside the container": f"0::/kubepods/burstable/pod{UID}/{CID}/init.scope\n",
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_names_the_pod_and_the_container(layout):
    assert parse_cgroup(LAYOUTS[layout]) == ContainerRef(UID, CID)


@pytest.mark.parametrize(
    "text",
    [
        "0::/system.slice/containerd.service\n",  # the runtime itself, on the host
        "0::/user.slice/user-1000.slice/session-3.scope\n",
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{U_}.slice/crio-conmon-{CID}.scope\n",
        f"0::/kubepods/burstable/pod{UID}\n",  # the pod's own cgroup, no container
        "",
        "garbage without colons\n",
    ],
)
def test_a_process_outside_a_container_has_no_pod(text):
    assert parse_cgroup(text) is None


def test_container_of_reads_under_the_injected_proc_root_and_survives_a_gone_process(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(LAYOUTS["v2 systemd containerd"])
    assert container_of(4242, proc_root=tmp_path) == ContainerRef(UID, CID)
    assert container_of(4243, proc_root=tmp_path) is None  # exited between NVML's list and the read


def test_the_pod_list_maps_a_container_to_its_namespace_pod_and_name():
    pods = [
        {
            "metadata": {"namespace": "genai", "name": "llm-serve", "uid": UID},
            "status": {
                "initContainerStatuses": [{"name": "fetch", "containerID": f"containerd://{'a' * 64}"}],
                "containerStatuses": [{"name": "server", "containerID": f"containerd://{CID}"}],
            },
        },
        {"metadata": {"namespace": "x", "name": "pending", "uid": "u"}, "status": {}},  # no containers yet
    ]
    index = PodIndex(pods)
    assert index.lookup(parse_cgroup(LAYOUTS["v2 cgroupfs"])) == ("genai", "llm-serve", "server")
    assert index.lookup(ContainerRef(UID, "a" * 64)) == ("genai", "llm-serve", "fetch")
    assert index.lookup(ContainerRef(UID, "b" * 64)) is None
    assert index.lookup(None) is None
