"""Pod attribution from the kubelet PodResources v1 API: client, device-ID resolution, allocation series.

``api.proto`` is the wire contract (kubernetes/kubelet ``pkg/apis/podresources/v1``); the generated stubs
beside it come from ``python -m gpumeter.exporter.kubelet.generate``. See docs/pod-attribution.md.
"""
