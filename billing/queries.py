"""Billing's questions to the metrics store: one PromQL aggregate per input series, per closed hour
(docs/billing.md §6). They live with billing, which alone sends them; the series they read are the
contract's (gpumeter/contract/), checked against the exporter and the history generator by
tests/test_contract_parity.py."""

from __future__ import annotations

from dataclasses import dataclass

from gpumeter.contract import (
    ALLOCATION,
    ALLOCATION_COMPUTE,
    ALLOCATION_MEMORY,
    COMPUTE_SLICES,
    GPU,
    GPU_INFO,
    GPU_INSTANCE_ID,
    HOSTNAME,
    KUBE_NAMESPACE_LABELS,
    LABEL_TEAM,
    MEMORY_SLICES,
    MIG_INFO,
    MIG_MODE,
    MIG_PROFILE,
    MIG_SM_UTILIZATION,
    MODEL,
    NAMESPACE,
    PROCESS_MEMORY_USED,
    PROCESS_SM_UTILIZATION,
    UTILIZATION,
    UUID,
    Series,
)


@dataclass(frozen=True, slots=True)
class HourQuery:
    """``<function>(<series>[<window>])`` per series, reduced to ``max by (<by>)``.

    ``max by`` keeps only the labels billing reads, which drops the scrape's and HA replicas'
    labels (prometheus_replica, instance, job): replicas of one sample are de-duplicated by max.
    Billing sends `promql` and takes the max itself (billing/ingest/columns.py `_columns`): Prometheus 2.42
    spends about half of such a range query hashing every series' labels at every step for the
    aggregation (docs/billing.md §2.2). `aggregated` is the same answer from the engine alone.
    """

    series: Series
    function: str  # a PromQL <aggregation>_over_time
    by: tuple[str, ...]
    # the value an answer leaves out, which billing reads back from its absence: the engine sends,
    # and billing decodes, only the other points (None: every point)
    left_out: str | None = None

    def __post_init__(self) -> None:
        unknown = [label for label in self.by if label not in self.series.labels]
        if unknown:
            raise ValueError(f"contract: {self.series.name} has no label {', '.join(unknown)}")

    def promql(self, window: str = "1h") -> str:
        """What billing sends: the function per series, every label kept (without `left_out`)."""
        selected = f"{self.function}({self.series.name}[{window}])"
        return selected if self.left_out is None else f"{selected} != {self.left_out}"

    def aggregated(self, window: str = "1h") -> str:
        """``max by (<by>)`` of `promql`, computed by the query engine."""
        return f"max by ({','.join(self.by)}) ({self.promql(window)})"


BILLING_QUERIES: dict[str, HourQuery] = {
    # every allocation label: the two answers are matched series by series on these values
    "alloc_count": HourQuery(ALLOCATION, "count_over_time", ALLOCATION.labels),
    # an exclusive holding's share is 1 (most holdings): left out, and read as 1 where absent
    "alloc_share": HourQuery(ALLOCATION, "avg_over_time", ALLOCATION.labels, left_out="1"),
    # fractional holdings only: both fractions granted, for the slice_weight policy
    "alloc_memory": HourQuery(ALLOCATION_MEMORY, "avg_over_time", ALLOCATION.labels),
    "alloc_compute": HourQuery(ALLOCATION_COMPUTE, "avg_over_time", ALLOCATION.labels),
    "gpu_count": HourQuery(GPU_INFO, "count_over_time", (UUID, GPU, MODEL, HOSTNAME, MIG_MODE)),
    "mig_count": HourQuery(
        MIG_INFO, "count_over_time", (UUID, GPU_INSTANCE_ID, MIG_PROFILE, COMPUTE_SLICES, MEMORY_SLICES)
    ),
    "gpu_util": HourQuery(UTILIZATION, "avg_over_time", (UUID,)),
    "mig_util": HourQuery(MIG_SM_UTILIZATION, "avg_over_time", (UUID, GPU_INSTANCE_ID)),
    "teams": HourQuery(KUBE_NAMESPACE_LABELS, "last_over_time", (NAMESPACE, LABEL_TEAM)),
    # per container on each GPU (instance), for sharing_split: usage (docs/billing.md §3.5)
    "proc_sm": HourQuery(PROCESS_SM_UTILIZATION, "avg_over_time", PROCESS_SM_UTILIZATION.labels[1:]),
    "proc_memory": HourQuery(PROCESS_MEMORY_USED, "avg_over_time", PROCESS_MEMORY_USED.labels[1:]),
}

# The series billing consumes, in the order of its queries.
BILLING_INPUTS: tuple[Series, ...] = tuple(dict.fromkeys(q.series for q in BILLING_QUERIES.values()))
