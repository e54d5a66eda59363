"""Reports of a store without a cluster label are byte-identical to what they were before billing
learnt about clusters: the SHA-256 of every file the chargeback and allocations reports write from
the worked-example ledger (docs/billing.md §8), taken on the code before the change and pinned here.

A digest that moves means a cluster-free report changed: a new column, a reordered row, a changed
label. The figures themselves are checked by hand in test_worked_examples.py; this test only says
nothing moved. The files name the price book's temporary path, so that path is replaced by a
placeholder before hashing (as is the Prometheus's address, a free port) (and the manifests' own digests of the files as written are left out).
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest

from gpumeter.reports import allocations
from gpumeter.reports.model import month_period
from gpumeter.reports.render import RenderOptions
from gpumeter.reports.run import generate
from tests.reports.test_health import ledger as ledger  # the health report's fixtures
from tests.reports.test_health import prom as prom

NOVEMBER = month_period("2026-11")
FIXED_NOW = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)
BUDGETS_YAML = "namespaces:\n  research: gamma\nbudgets:\n  alpha: {amount: '2.00', currency: USD}\n  gamma: {amount: '5000', currency: USD}\n"

# (grouping, formats, grain, focus version) -> {file name: sha256}
CHARGEBACK_RUNS = [
    ("team", ("html", "csv", "json", "focus"), "day", "1.3", True),
    ("namespace", ("html", "csv", "json", "focus"), "hour", "1.2", False),
    ("model", ("html", "csv", "json"), "day", "1.3", False),
    ("mig_profile", ("csv", "json"), "day", "1.3", False),
]

# The worked ledger's unpriced GPU was an "NVIDIA B200"; since the Blackwell models are priced it is an
# "NVIDIA VR200" (still a model no book knows), and the files naming it were re-pinned: only that name moved
# (checked with a diff of the files).
# The summary CSVs were re-pinned again when the unpriced model's row lost a 17th field its header did
# not name (the CSV writer now refuses rows of unequal width): with one empty field put back, each file
# hashes to its earlier pin.
# The FOCUS files were re-pinned when an unpriced row's ListUnitPrice and ContractedUnitPrice became 0
# (FOCUS allows no null unit price on a Usage row): a diff of the files shows those two cells of the one
# unpriced row, and nothing else.
# And again when SkuPriceId became a digest of the model's price terms (stable over time, as FOCUS asks)
# instead of the book's digest and the version's start: a diff shows SkuPriceId, and its echo in
# x_OriginCharge, mapped one to one (a100-40gb:622c36b8f674@2026-01-01T00:00:00Z -> a100-40gb:d02e68bdef5a),
# and nothing else.
# The four summary CSVs were re-pinned when the total row's gpu_hours came to count the unpriced GPU-hours
# listed above it (the column did not add up): a cell-by-cell diff of each file shows the __total__ row's
# gpu_hours, 723.218748 -> 724.218748 (+ the VR200's 1.000000), and nothing else.
GOLDEN = {
    "by-team/gpumeter-2026-11-budgets.csv": "d637463b0aa2edb6050f377d85bb49cfa0c9623f0e543e83970923a9683416bb",
    "by-team/gpumeter-2026-11-by-team.csv": "00829bafbb37b705505c1c92a15a4e87a329ada0cb8804d2b55f0410880f4672",
    "by-team/gpumeter-2026-11-by-team.html": "3f76ef45316cad6e570393b854c0abfb81c35b2e96ce030eeb182e1cbafa0b6b",
    "by-team/gpumeter-2026-11-by-team.json": "17b52a7bbbcecc7e9c9cc2be81afc8689a705493ac83edd2246261ccefa7f8a5",
    "by-team/gpumeter-2026-11-focus-1.3.csv": "0add407394b334276d3c790757e8f3b4593c0766036b9c265f2a96c694a83d50",
    "by-team/gpumeter-2026-11-lines.csv": "75bd5d5f340d2e018f0e1340a5adf765a1c61ef5addca0d774c923c9c51b2b4c",
    "by-team/manifest.json": "7a6260bb7ed30bbbcafc4d534ba5cc9a05af6d41d5215b0096fc21ee7d017b14",
    "by-namespace/gpumeter-2026-11-by-namespace.csv": "e9620a2b14c2f4496f79edc45f52f7e84b4f50692449e8ef63e914fcb8d7b330",
    "by-namespace/gpumeter-2026-11-by-namespace.html": "634e29ab5999bc825586c544063b02f2e8a7acae9856c2bfcfe3ee4fe2051f07",
    "by-namespace/gpumeter-2026-11-by-namespace.json": "f1c53a66cdb59ae0976d9b3a3dd7f40e71d6a5620ffbed6518e8836e3b7d3cba",
    "by-namespace/gpumeter-2026-11-focus-1.2.csv": "6d35d97816ba1aa6c4eea6b7a393f19f42d0e4017422de13e72f113d22359781",
    "by-namespace/gpumeter-2026-11-lines.csv": "c35ebc2809ac4c6925228c5e18727c336d0031baa7810888f5e414677640445a",
    "by-namespace/manifest.json": "72d9b383ed8bfe1ee15510da6abcfd31c540551a9948e2870a8bc5d674f5a5d4",
    "by-model/gpumeter-2026-11-by-model.csv": "791c0b4c10afb87e164d605438fa855bae1346619e93d76468417b8cec1d674c",
    "by-model/gpumeter-2026-11-by-model.html": "113087d7f4087b0feb7b2fb6cf5676b860ade176b095bb98c5ec7f2cc2d6782f",
    "by-model/gpumeter-2026-11-by-model.json": "d568dfcbfd05e01d9b9181d99bdb66e1dca3f373ff9bd6ebf71aa34aa8796009",
    "by-model/gpumeter-2026-11-lines.csv": "75bd5d5f340d2e018f0e1340a5adf765a1c61ef5addca0d774c923c9c51b2b4c",
    "by-model/manifest.json": "0994b0bc2e4a67e102d2d41f7dfdf3b416b1b2c709ea5d4d00375f0c5fb9794a",
    "by-mig_profile/gpumeter-2026-11-by-mig_profile.csv": "950d448c8ec38bbfe4b3e395dc91cec2666a0d52c7f9f11ca369bef3944b3719",
    "by-mig_profile/gpumeter-2026-11-by-mig_profile.json": "847dc99e00c45864443b161cbff6dd582b7b200f1da0ef7506da2e722716d731",
    "by-mig_profile/gpumeter-2026-11-lines.csv": "75bd5d5f340d2e018f0e1340a5adf765a1c61ef5addca0d774c923c9c51b2b4c",
    "by-mig_profile/manifest.json": "4f722bf9cccda828a959af3e8cb89dd36dde5867589dd485bcae7476dd117ccf",
    "allocations/gpumeter-allocations-2026-11.csv": "93f2a8dedd432c75f84cb14da5f49aee0742130f5eb33be6a3c4dc9ec80d74f0",
    "allocations/gpumeter-allocations-2026-11.html": "04b6d3ec6326669435ee9547229565e5646b2a51f9223f7b1601788303c920c5",
}

HEALTH_GOLDEN = {
    "gpumeter-health-2026-10-01_2026-10-11-gpus.csv": "4d8dd474865c22d4438a93e791f74045a95e973360c8e7669c938dde5b7883cd",
    "gpumeter-health-2026-10-01_2026-10-11-pools.csv": "9c4836fecf6a45e115ae66d260570511bfb6c9470344c84f5ccb4c5064fa06bb",
    "gpumeter-health-2026-10-01_2026-10-11-teams.csv": "30b393f013af00960467a957cdcc415b616b79e8a1bd7a9fc32c5f8b2313c5b9",
    "gpumeter-health-2026-10-01_2026-10-11.html": "7b25aa70755b811fd89c86e8def0d7bc196a0ae1849af4252acb178b62dc86cb",
    "gpumeter-health-2026-10-01_2026-10-11.json": "5b1559bd4fbea4d9487c439e7a3d5360ee04843e2cdbc7c5381e91709865c45b",
    "manifest-health.json": "87f058699221b999629a0507fc9366323081e2d83f23bf015e6ecb022f8ef92e",
}


def _digests(out, book_dir: str, prometheus: str = "<none>") -> dict[str, str]:
    digests = {}
    for path in sorted(out.iterdir()):
        data = path.read_bytes().replace(book_dir.encode(), b"<book>").replace(prometheus.encode(), b"<prom>")
        if path.name.startswith("manifest"):
            # its digests are of the files as written, temporary path and all; each file is pinned itself
            manifest = json.loads(data)
            manifest["files"] = sorted(manifest["files"])
            data = json.dumps(manifest, indent=1, sort_keys=True).encode()
        digests[path.name] = hashlib.sha256(data).hexdigest()
    return digests


def _render_all(ledger, worked_book, tmp_path):
    from gpumeter.billing.config import load_budgets

    budgets_file = tmp_path / "teams.yaml"
    budgets_file.write_text(BUDGETS_YAML)
    book_dir = str(worked_book.path).rsplit("/", 1)[0]
    produced: dict[str, str] = {}
    for grouping, formats, grain, version, with_budgets in CHARGEBACK_RUNS:
        out = tmp_path / f"by-{grouping}"
        generate(
            ledger,
            NOVEMBER,
            grouping,
            formats,
            out,
            grain=grain,
            options=RenderOptions(generated_at=FIXED_NOW, focus_version=version),
            now=FIXED_NOW,
            record=False,
            budgets=load_budgets(budgets_file) if with_budgets else None,
        )
        produced |= {f"by-{grouping}/{name}": d for name, d in _digests(out, book_dir).items()}
    out = tmp_path / "allocations"
    report = allocations.build_allocations(ledger, NOVEMBER)
    allocations.render(report, out, allocations.FORMATS, generated_at=FIXED_NOW)
    produced |= {f"allocations/{name}": d for name, d in _digests(out, book_dir).items()}
    return produced


def test_reports_without_a_cluster_are_byte_identical(worked_ledger, worked_book, tmp_path):
    produced = _render_all(worked_ledger, worked_book, tmp_path)
    assert produced == GOLDEN


@pytest.mark.prometheus
def test_health_report_without_a_cluster_is_byte_identical(prom, ledger, tmp_path):
    """The fleet-health report from test_health.py's hand-worked history (series with no cluster)."""
    from gpumeter.billing.prom import PrometheusClient
    from gpumeter.reports import health_render
    from tests.reports.test_health import PERIOD

    out = tmp_path / "health"
    with PrometheusClient(prom.url) as client:
        health_render.generate(
            client, ledger, PERIOD, health_render.FORMATS, out, now=FIXED_NOW, record=False
        )
    produced = _digests(out, str(tmp_path.parent), prom.url)
    assert produced == HEALTH_GOLDEN
