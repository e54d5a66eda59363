"""The PodResources v1 wire contract and the committed stubs."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf.descriptor import FieldDescriptor

from gpumeter.exporter.kubelet import api_pb2, api_pb2_grpc, generate

F = FieldDescriptor
MSG, STR, I64, U64 = F.TYPE_MESSAGE, F.TYPE_STRING, F.TYPE_INT64, F.TYPE_UINT64

# kubernetes/kubelet pkg/apis/podresources/v1/api.proto (docs/dcgm-mode.md §A.5.7):
# message -> (field name, number, type, repeated)
UPSTREAM = {
    "AllocatableResourcesRequest": [],
    "AllocatableResourcesResponse": [("devices", 1, MSG, True), ("cpu_ids", 2, I64, True),
                                     ("memory", 3, MSG, True)],
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, MSG, True)],
    "PodResources": [("name", 1, STR, False), ("namespace", 2, STR, False), ("containers", 3, MSG, True),
                     ("cpu_ids", 4, I64, True), ("memory", 5, MSG, True)],
    "ContainerResources": [("name", 1, STR, False), ("devices", 2, MSG, True), ("cpu_ids", 3, I64, True),
                           ("memory", 4, MSG, True), ("dynamic_resources", 5, MSG, True)],
    "ContainerMemory": [("memory_type", 1, STR, False), ("size", 2, U64, False), ("topology", 3, MSG, False)],
    "ContainerDevices": [("resource_name", 1, STR, False), ("device_ids", 2, STR, True),
                         ("topology", 3, MSG, False)],
    "TopologyInfo": [("nodes", 1, MSG, True)],
    "NUMANode": [("ID", 1, I64, False)],
    "DynamicResource": [("claim_name", 2, STR, False), ("claim_namespace", 3, STR, False),
                        ("claim_resources", 4, MSG, True)],
    "ClaimResource": [("cdi_devices", 1, MSG, True), ("driver_name", 2, STR, False),
                      ("pool_name", 3, STR, False), ("device_name", 4, STR, False),
                      ("share_id", 5, STR, False)],
    "CDIDevice": [("name", 1, STR, False)],
    "GetPodResourcesRequest": [("pod_name", 1, STR, False), ("pod_namespace", 2, STR, False)],
    "GetPodResourcesResponse": [("pod_resources", 1, MSG, False)],
}  # fmt: skip


def test_package_and_service():
    assert api_pb2.DESCRIPTOR.package == "v1"
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    methods = {m.name: (m.input_type.full_name, m.output_type.full_name) for m in service.methods}
    assert methods == {
        "List": ("v1.ListPodResourcesRequest", "v1.ListPodResourcesResponse"),
        "GetAllocatableResources": ("v1.AllocatableResourcesRequest", "v1.AllocatableResourcesResponse"),
        "Get": ("v1.GetPodResourcesRequest", "v1.GetPodResourcesResponse"),
    }


@pytest.mark.parametrize("message", list(UPSTREAM))
def test_messages_match_upstream(message):
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    fields = [(f.name, f.number, f.type, f.is_repeated) for f in descriptor.fields]
    assert fields == UPSTREAM[message]


def test_share_id_is_proto3_optional():
    field = api_pb2.ClaimResource.DESCRIPTOR.fields_by_name["share_id"]
    assert field.has_presence


def test_no_other_messages():
    assert set(api_pb2.DESCRIPTOR.message_types_by_name) == set(UPSTREAM)


def test_stubs_are_fresh(tmp_path):
    """`make proto` output is committed: regenerating must give the same bytes."""
    written = generate.generate(tmp_path)
    assert sorted(p.name for p in written) == sorted(generate.OUTPUTS)
    here = Path(generate.__file__).parent
    for name in generate.OUTPUTS:
        assert (tmp_path / name).read_bytes() == (here / name).read_bytes(), (
            f"exporter/kubelet/{name} is stale: run `python -m gpumeter.exporter.kubelet.generate`"
        )


def test_grpc_stub_imports_package_relative():
    source = Path(api_pb2_grpc.__file__).read_text()
    assert "from . import api_pb2 as" in source
    assert api_pb2_grpc.exporter_dot_kubelet_dot_api__pb2 is api_pb2
