"""Revision 0008 on SQLite and PostgreSQL: a ledger's MIG instances and allocations, stored a row each
at 0007, become one shared layout per distinct layout plus each GPU-hour's readings, read back as the
same GPU-hours; the downgrade gives the 0007 rows back identically."""

from __future__ import annotations

import dataclasses
import hashlib
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from gpumeter.billing.ledger import layouts, open_ledger
from gpumeter.billing.ledger.sqlalchemy import MIGRATIONS, make_engine, upgrade
from gpumeter.billing.ledger.types import Exact, UtcDateTime
from gpumeter.billing.models import Allocation, Device, GpuHour, MigInstance

HOUR_A = datetime(2026, 11, 20, 10, tzinfo=UTC)
HOUR_B = HOUR_A + timedelta(hours=1)
A100, H100 = "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"
D = Decimal

# The 0007 tables as typed Core tables: Exact binds exact text on SQLite, Decimal on PostgreSQL.
_META = sa.MetaData()
GPU_HOURS = sa.Table(
    "gpu_hours",
    _META,
    sa.Column("hour", UtcDateTime(), primary_key=True),
    sa.Column("uuid", sa.Text(), primary_key=True),
    sa.Column("hostname", sa.Text()),
    sa.Column("gpu", sa.Text()),
    sa.Column("model", sa.Text()),
    sa.Column("mig_mode", sa.Boolean()),
    sa.Column("present_seconds", sa.Integer()),
    sa.Column("utilization", Exact(12, 9)),
)
MIG_INSTANCES = sa.Table(
    "mig_instances",
    _META,
    sa.Column("hour", UtcDateTime(), primary_key=True),
    *(sa.Column(name, sa.Text(), primary_key=True) for name in ("uuid", "gpu_instance_id", "mig_profile")),
    *(sa.Column(name, sa.Integer()) for name in ("compute_slices", "memory_slices", "present_seconds")),
    sa.Column("utilization", Exact(12, 9)),
)
ALLOCATIONS = sa.Table(
    "allocations",
    _META,
    sa.Column("hour", UtcDateTime(), primary_key=True),
    *(
        sa.Column(name, sa.Text(), primary_key=True)
        for name in ("uuid", "gpu_instance_id", "namespace", "pod", "container", "resource")
    ),
    sa.Column("hostname", sa.Text()),
    sa.Column("mig_profile", sa.Text()),
    sa.Column("allocated_seconds", sa.Integer()),
    sa.Column("share", Exact(12, 9)),
    sa.Column("utilization", Exact(12, 9)),
    sa.Column("sharing", sa.String(16)),
    sa.Column("memory_share", Exact(12, 9)),
    sa.Column("compute_share", Exact(12, 9)),
    sa.Column("process_sm", Exact(12, 9)),
    sa.Column("process_memory", Exact(20, 0)),
)
FACT_TABLES = ("gpu_hours", "mig_instances", "allocations")


def _held(uuid: str, ns: str, pod: str, container: str, seconds: int, share: str, **fields) -> Allocation:
    return Allocation(uuid, ns, pod, container, seconds, D(share), **fields)


def _mig_gpu() -> GpuHour:
    """A MIG A100: two 3g.40gb instances; instance 1 held by two pods one after the other (half an hour
    each), instance 2 unallocated (and without a utilization reading). Instances and allocations are
    listed in the canonical order: "Ns-B" < "ns-a" by code point."""
    uuid = "GPU-mig"
    instance = {"gpu_instance_id": "1", "mig_profile": "3g.40gb", "resource": "nvidia.com/mig-3g.40gb"}
    mig = {**instance, "hostname": "node-1", "sharing": "mig"}
    return GpuHour(
        HOUR_A,
        Device(uuid, A100, 3600, "node-1", "0", True, D("0.412500000")),
        [
            MigInstance(uuid, "1", "3g.40gb", 3, 4, 3600, D("0.620000000")),
            MigInstance(uuid, "2", "3g.40gb", 3, 4, 3600, None),
        ],
        [
            _held(uuid, "Ns-B", "infer-0", "server", 1800, "1", utilization=D("0.510000000"), **mig),
            _held(uuid, "ns-a", "train-0", "main", 1800, "1", utilization=D("0.730000000"), **mig),
        ],
    )


def _time_sliced(hour: datetime, readings: tuple[tuple[str, str, str], ...]) -> GpuHour:
    """A whole H100 time-sliced between two pods at share 1/2 each, with process use measured:
    readings: (utilization, process SM, process memory) of each pod."""
    uuid = "GPU-ts"
    replica = {"resource": "nvidia.com/gpu.shared", "hostname": "node-2", "sharing": "time_slicing"}
    pods = []
    for (ns, pod), measured in zip((("ns-a", "web-0"), ("ns-c", "web-1")), readings, strict=True):
        use = dict(zip(("utilization", "process_sm", "process_memory"), map(D, measured), strict=True))
        pods.append(_held(uuid, ns, pod, "main", 3600, "0.5", **replica, **use))
    return GpuHour(hour, Device(uuid, H100, 3600, "node-2", "1", False, D("0.600000000")), [], pods)


def _fractional() -> GpuHour:
    """An H100 of which one notebook holds a HAMi grant of a quarter of the memory, half the compute
    (no utilization reading)."""
    uuid = "GPU-frac"
    grant = {"resource": "nvidia.com/gpumem", "hostname": "node-2", "sharing": "fractional"}
    grant |= {"memory_share": D("0.25"), "compute_share": D("0.5")}
    holder = _held(uuid, "ns-d", "notebook", "jupyter", 2700, "0.25", **grant)
    return GpuHour(HOUR_A, Device(uuid, H100, 3600, "node-2", "2", False, D("0.100000000")), [], [holder])


def _idle(hour: datetime) -> GpuHour:
    """A whole GPU nobody held: no layout."""
    return GpuHour(hour, Device("GPU-idle", H100, 3600, "node-2", "3", False, D("0")))


def _whole(uuid: str, gpu: str, hour: datetime, utilization: str) -> GpuHour:
    """One of the two whole H100s of a pod that holds both: the same layout on both GPUs, both hours."""
    alone = {"resource": "nvidia.com/gpu", "hostname": "node-3", "sharing": "exclusive"}
    holder = _held(uuid, "ns-e", "batch", "main", 3600, "1", utilization=D(utilization), **alone)
    return GpuHour(hour, Device(uuid, H100, 3600, "node-3", gpu, False, D(utilization)), [], [holder])


# What the ledger holds, each hour's GPU-hours by uuid (the order facts() reads them in)
FACTS = {
    HOUR_A: [
        _fractional(),
        _idle(HOUR_A),
        _mig_gpu(),
        _time_sliced(
            HOUR_A, (("0.300000000", "0.200000000", "1073741824"), ("0.250000000", "0.150000000", "0"))
        ),
        _whole("GPU-whole", "4", HOUR_A, "0.900000000"),
        _whole("GPU-whole2", "5", HOUR_A, "0.850000000"),
    ],
    HOUR_B: [
        _idle(HOUR_B),
        _time_sliced(
            HOUR_B, (("0.400000000", "0.350000000", "2147483648"), ("0.100000000", "0.050000000", "0"))
        ),
        _whole("GPU-whole", "4", HOUR_B, "0.800000000"),
        _whole("GPU-whole2", "5", HOUR_B, "0.750000000"),
    ],
}
# Distinct layouts: the MIG GPU's, the time-sliced GPU's (both hours), the fractional GPU's, and the
# whole pod's (two GPUs, two hours). The idle GPU names none. Shared: time-sliced and fractional.
LAYOUTS = 4
SHARED = {"GPU-mig": False, "GPU-ts": True, "GPU-frac": True, "GPU-whole": False, "GPU-whole2": False}
# The time-sliced GPU's layout and hour-B readings, written out: the canonical text of layouts.py
TS_BODY = (
    '{"instances":[],"allocations":['
    '["ns-a","web-0","main","nvidia.com/gpu.shared","","","node-2",3600,"0.5","time_slicing",null,null],'
    '["ns-c","web-1","main","nvidia.com/gpu.shared","","","node-2",3600,"0.5","time_slicing",null,null]]}'
)
TS_READINGS_B = '[[],[["0.400000000","0.350000000","2147483648"],["0.100000000","0.050000000","0"]]]'
MIG_READINGS = '[["0.620000000",null],[["0.510000000",null,null],["0.730000000",null,null]]]'


def _insert_0007(engine: sa.Engine) -> None:
    """The facts as the 0007 ledger stored them, a row per GPU-hour, instance and allocation, inserted
    in the reverse of the canonical order (the migration must not depend on the order rows come in)."""
    gpu_rows, instance_rows, allocation_rows = [], [], []
    for hour, gpu_hours in FACTS.items():
        for gh in reversed(gpu_hours):
            device = dataclasses.asdict(gh.device)
            gpu_rows.append({"hour": hour, **device})
            for i in reversed(gh.instances):
                instance_rows.append({"hour": hour, **dataclasses.asdict(i)})
            for a in reversed(gh.allocations):
                allocation_rows.append({"hour": hour, **dataclasses.asdict(a)})
    with engine.begin() as conn:
        conn.execute(sa.insert(GPU_HOURS), gpu_rows)
        conn.execute(sa.insert(MIG_INSTANCES), instance_rows)
        conn.execute(sa.insert(ALLOCATIONS), allocation_rows)
    assert (len(gpu_rows), len(instance_rows), len(allocation_rows)) == (10, 2, 11)


def _downgrade(engine: sa.Engine, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def _raw_rows(engine: sa.Engine) -> dict[str, list[tuple]]:
    """Every fact row as the driver gives it (exact text on SQLite), in key order."""
    keys = {
        "gpu_hours": "hour, uuid",
        "mig_instances": "hour, uuid, gpu_instance_id, mig_profile",
        "allocations": "hour, uuid, gpu_instance_id, namespace, pod, container, resource",
    }
    with engine.connect() as conn:
        return {
            table: [tuple(row) for row in conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY {key}"))]
            for table, key in keys.items()
        }


def _schema(engine: sa.Engine) -> dict[str, dict]:
    """The fact tables as reflected: columns (types as text), primary key, foreign keys, indexes."""
    inspector = sa.inspect(engine)
    out = {}
    for table in FACT_TABLES:
        columns = [{**c, "type": str(c["type"])} for c in inspector.get_columns(table)]
        out[table] = {
            "columns": columns,
            "pk": inspector.get_pk_constraint(table),
            "fks": inspector.get_foreign_keys(table),
            "indexes": inspector.get_indexes(table),
            "unique": inspector.get_unique_constraints(table),
        }
    return out


def _assert_same_gpu_hours(actual: list[GpuHour], expected: list[GpuHour]) -> None:
    """Equal field by field, and every value of the same type (a Decimal equals a float it rounds to)."""
    assert actual == expected
    for got, want in zip(actual, expected, strict=True):
        pairs = [(got.device, want.device)]
        pairs += list(zip(got.instances, want.instances, strict=True))
        pairs += list(zip(got.allocations, want.allocations, strict=True))
        assert got.hour == want.hour and got.hour.tzinfo is not None
        for g, w in pairs:
            for f in dataclasses.fields(w):
                assert type(getattr(g, f.name)) is type(getattr(w, f.name)), (w, f.name)
                assert getattr(g, f.name) == getattr(w, f.name), (w, f.name)


def _aware(stored) -> datetime:
    """A gpu_hours.hour as the driver gives it (text on SQLite, naive UTC on PostgreSQL), made aware."""
    if isinstance(stored, str):
        stored = datetime.fromisoformat(stored)
    return stored.replace(tzinfo=UTC)


def _restored(row, bodies: dict[int, str]) -> GpuHour:
    """A GpuHour from a raw gpu_hours row at head by layouts.py alone (SQLite gives 0/1 and text,
    PostgreSQL bools and Decimals)."""
    hour, uuid, model, seconds, hostname, gpu, mig_mode, utilization, layout_id, readings = row
    device = Device(
        uuid, model, seconds, hostname, gpu, bool(mig_mode), None if utilization is None else D(utilization)
    )
    layout = None if layout_id is None else layouts.parse_layout(bodies[layout_id])
    return layouts.restore(_aware(hour), device, layout, readings)


def test_0008_converts_facts_to_layouts_and_back(db):
    url, schema = db
    engine = make_engine(url, schema=schema)
    try:
        upgrade(engine, "0007")
        _insert_0007(engine)
        before_rows, before_schema = _raw_rows(engine), _schema(engine)

        upgrade(engine)
        tables = set(sa.inspect(engine).get_table_names())
        assert "gpu_layouts" in tables
        assert "mig_instances" not in tables and "allocations" not in tables
        with engine.connect() as conn:
            stored = conn.execute(
                sa.text("SELECT id, digest, body, shared FROM gpu_layouts ORDER BY id")
            ).all()
            rows = conn.execute(
                sa.text(
                    "SELECT hour, uuid, model, present_seconds, hostname, gpu, mig_mode, utilization, layout_id, "
                    "readings FROM gpu_hours ORDER BY hour, uuid"
                )
            ).all()
        assert len(stored) == LAYOUTS
        for _, digest, body, _ in stored:
            assert digest == hashlib.sha256(body.encode()).hexdigest()
        bodies = {layout_id: body for layout_id, _, body, _ in stored}
        shared = {layout_id: bool(flag) for layout_id, _, _, flag in stored}

        assert len(rows) == 10
        layout_of: dict[str, set[int]] = {}
        readings_of: dict[tuple[datetime, str], str] = {}
        for hour, uuid, *_, layout_id, readings in rows:
            if uuid == "GPU-idle":
                assert layout_id is None and readings is None
                continue
            assert shared[layout_id] is SHARED[uuid]
            layout_of.setdefault(uuid, set()).add(layout_id)
            readings_of[_aware(hour), uuid] = readings
        # one layout over both hours, and over both GPUs of the pod that holds two
        assert {uuid: len(ids) for uuid, ids in layout_of.items()} == dict.fromkeys(SHARED, 1)
        assert layout_of["GPU-whole"] == layout_of["GPU-whole2"]
        assert len(set().union(*layout_of.values())) == LAYOUTS
        (ts_layout,) = layout_of["GPU-ts"]
        assert bodies[ts_layout] == TS_BODY
        assert readings_of[HOUR_B, "GPU-ts"] == TS_READINGS_B
        assert readings_of[HOUR_A, "GPU-mig"] == MIG_READINGS

        # the GPU-hours come back as they were: from the raw rows by layouts.py alone (whatever the
        # ledger's code does) ...
        for hour, expected in FACTS.items():
            restored = [_restored(row, bodies) for row in rows if _aware(row[0]) == hour]
            _assert_same_gpu_hours(restored, expected)
        # ... and from the ledger opened at head
        ledger = open_ledger(url, schema=schema)
        try:
            for hour, expected in FACTS.items():
                _assert_same_gpu_hours(ledger.facts(hour), expected)
        finally:
            ledger.close()

        _downgrade(engine, "0007")
        assert "gpu_layouts" not in sa.inspect(engine).get_table_names()
        assert _schema(engine) == before_schema
        assert _raw_rows(engine) == before_rows
    finally:
        engine.dispose()


def test_0008_drops_instances_and_allocations_without_their_gpu_hour(tmp_path, caplog):
    """Rows the 0007 ledger never wrote (and could not read back): an instance and an allocation with no
    gpu_hours row of their hour and GPU are dropped, with a warning."""
    url = f"sqlite:///{tmp_path / 'orphans.db'}"
    engine = make_engine(url)
    try:
        upgrade(engine, "0007")
        _insert_0007(engine)
        mig_gpu = _mig_gpu()
        with engine.begin() as conn:
            conn.execute(
                sa.insert(MIG_INSTANCES), [{"hour": HOUR_B, **dataclasses.asdict(mig_gpu.instances[0])}]
            )
            conn.execute(
                sa.insert(ALLOCATIONS), [{"hour": HOUR_B, **dataclasses.asdict(mig_gpu.allocations[0])}]
            )
        caplog.set_level("WARNING", logger="alembic.runtime.migration")
        upgrade(engine)
    finally:
        engine.dispose()
    assert "mig_instances: 1 row(s) have no gpu_hours row" in caplog.text
    assert "allocations: 1 row(s) have no gpu_hours row" in caplog.text
    ledger = open_ledger(url)
    try:
        _assert_same_gpu_hours(ledger.facts(HOUR_B), FACTS[HOUR_B])
    finally:
        ledger.close()
