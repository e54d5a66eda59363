"""Revision 0012 on SQLite and PostgreSQL: a ledger at 0011 gains `gpu_hours.cluster` (in its key)
and `cost_line_terms.cluster` without any stored line or term digest changing; at head, one UUID in
two clusters is two GPU-hours and two sets of lines, each naming its cluster, a GPU without a cluster
keeps the key and term it had before; the downgrade refuses a ledger that holds one UUID in two
clusters, and otherwise gives 0011's schema back.

By hand: an A100 at 3.00 an hour, held all hour by one pod: one tenant line of 3.00 per GPU-hour;
east and west each bill 3.00 for GPU-same, 6.00 the hour."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from decimal import Decimal

import pytest
import sqlalchemy as sa

from gpumeter.billing.allocate import price_gpu_hour
from gpumeter.billing.ledger import open_ledger
from gpumeter.billing.ledger.base import HourRecord
from gpumeter.billing.ledger.sqlalchemy import make_engine, upgrade
from gpumeter.billing.models import line_key
from tests.billing.factories import A100, HOUR0, alloc, book, gpu_hour
from tests.billing.test_migration_0008 import _downgrade
from tests.billing.test_migration_0009 import LINES, _insert_0008
from tests.billing.test_migration_0010 import VIEW, _rows

D = Decimal


def _terms(engine) -> list[tuple]:
    return _rows(engine, "SELECT id, digest, line_key FROM cost_line_terms ORDER BY id")


def _clustered(uuid: str, cluster: str, ns: str):
    gh = gpu_hour(uuid, A100, allocations=[alloc(uuid, ns, "p")], hour=HOUR0)
    gh.device = dataclasses.replace(gh.device, cluster=cluster)
    return gh


def test_0012_adds_the_cluster_keeps_every_line_and_bills_one_uuid_in_two_clusters_apart(db, tmp_path):
    url, schema = db
    engine = make_engine(url, schema=schema)
    try:
        upgrade(engine, "0008")
        _insert_0008(engine, LINES)
        upgrade(engine, "0011")
        viewed, terms_before = _rows(engine, VIEW), _terms(engine)

        upgrade(engine, "0012")
        inspector = sa.inspect(engine)
        assert set(inspector.get_pk_constraint("gpu_hours")["constrained_columns"]) == {
            "hour",
            "cluster",
            "uuid",
        }
        assert "cluster" in {c["name"] for c in inspector.get_columns("cost_line_terms")}
        # every line as it was, with no cluster (NULL); every term keeps its digest and key
        assert _rows(engine, VIEW) == [(*row[:19], None, *row[19:]) for row in viewed]
        assert _terms(engine) == terms_before

        prices = book(tmp_path, {"A100-40GB": "3.00"})
        hours = [
            _clustered("GPU-same", "east", "ml"),
            _clustered("GPU-same", "west", "ml"),
            _clustered("GPU-own", "", "ml"),
        ]
        lines = [line for gh in hours for line in price_gpu_hour(gh, prices).lines]
        ledger = open_ledger(url, schema=schema)
        try:
            ledger.write_hour(HourRecord(HOUR0, hours, lines, prices))
            facts = ledger.facts(HOUR0)
            read = ledger.lines(HOUR0, HOUR0 + timedelta(hours=1))
        finally:
            ledger.close()
        assert [(f.device.cluster, f.device.uuid) for f in facts] == [
            ("", "GPU-own"),
            ("east", "GPU-same"),
            ("west", "GPU-same"),
        ]
        assert sorted((line.cluster, line.uuid, line.namespace, line.amount) for line in read) == [
            ("", "GPU-own", "ml", D("3.00")),
            ("east", "GPU-same", "ml", D("3.00")),
            ("west", "GPU-same", "ml", D("3.00")),
        ]
        assert sum(line.amount for line in read) == D("6.00") + D("3.00")
        own = next(line for line in read if not line.cluster)
        assert (
            line_key(own)
            == line_key(dataclasses.replace(own, cluster=""))
            != line_key(dataclasses.replace(own, cluster="east"))
        )
        # NULL for the line without a cluster, the name for the others
        stored = _rows(
            engine, "SELECT uuid, cluster FROM cost_line_terms WHERE uuid IN ('GPU-own', 'GPU-same')"
        )
        assert sorted(stored, key=lambda r: (r[0], r[1] or "")) == [
            ("GPU-own", None),
            ("GPU-same", "east"),
            ("GPU-same", "west"),
        ]

        _downgrade(engine, "0012")  # open_ledger took it to head; the revisions after 0012 first
        with pytest.raises(RuntimeError, match="uuid GPU-same is in two clusters"):
            _downgrade(engine, "0011")
        with engine.begin() as conn:  # the hour gone again: nothing the old key cannot hold
            conn.execute(sa.text("DELETE FROM cost_line_groups"))
            conn.execute(sa.text("DELETE FROM gpu_hours"))
        _downgrade(engine, "0011")
        inspector = sa.inspect(engine)
        assert inspector.get_pk_constraint("gpu_hours")["constrained_columns"] == ["hour", "uuid"]
        assert "cluster" not in {c["name"] for c in inspector.get_columns("cost_line_terms")}
    finally:
        engine.dispose()
