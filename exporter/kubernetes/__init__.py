"""The exporter's view of the Kubernetes API: this node's pods, for fractional GPU holdings
(HAMi, gpushare) that only the pods' annotations describe (docs/pod-attribution.md §Fractional)."""
