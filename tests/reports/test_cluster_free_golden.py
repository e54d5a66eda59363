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

# The worked ledger's unpriced GPU is an "NVIDIA B200": since the Blackwell models are known its NVML
# name reads as the canonical B200-180GB in every report, and the files naming it were re-pinned (only that
# name moved, checked with a diff of the files). It stays unpriced: the worked book has no B200 row.
GOLDEN = {
    "by-team/gpumeter-2026-11-budgets.csv": "d637463b0aa2edb6050f377d85bb49cfa0c9623f0e543e83970923a9683416bb",
    "by-team/gpumeter-2026-11-by-team.csv": "d862bfe9927cf650d4adf8da5bd75cf432dd772dbd378696014c6456127fb1a4",
    "by-team/gpumeter-2026-11-by-team.html": "8960205f4d5bedd640f54e70ff4c3759aa052158480ce7eb497afa706c3e9b85",
    "by-team/gpumeter-2026-11-by-team.json": "c2c85881e9a0aa8cdce85870e6adb3fcf1ce6fb71770cd32ea4352d3566b5d8d",
    "by-team/gpumeter-2026-11-focus-1.3.csv": "320d5fa677745747838994ee1aadd2a8bd554d395361ad2c5e492a25f477b650",
    "by-team/gpumeter-2026-11-lines.csv": "ef01b1329190bf3221aee267a3df6e6bd5861deeedede71a652d115b159f2cbe",
    "by-team/manifest.json": "7a6260bb7ed30bbbcafc4d534ba5cc9a05af6d41d5215b0096fc21ee7d017b14",
    "by-namespace/gpumeter-2026-11-by-namespace.csv": "3d893d16458ad91be275e7b1f83f48633d6e38b1aed093c1ad6a5c041806647f",
    "by-namespace/gpumeter-2026-11-by-namespace.html": "d026e4c72afd23e46fc160e134c3b4e8be2d31e367629f47df13fdedfe2dbba9",
    "by-namespace/gpumeter-2026-11-by-namespace.json": "192b73cd3cb86c0b0eee279568e303e0b677eb2b11f8c9e60f00351523dac69d",
    "by-namespace/gpumeter-2026-11-focus-1.2.csv": "42cbe6a340ac75651fcbb78a789ea5a6b745d537084852594fa104684fd5a872",
    "by-namespace/gpumeter-2026-11-lines.csv": "771aacdbc963954983c8ee7f147108efe23ef844ddc3444bf63c6e2a0ab34834",
    "by-namespace/manifest.json": "72d9b383ed8bfe1ee15510da6abcfd31c540551a9948e2870a8bc5d674f5a5d4",
    "by-model/gpumeter-2026-11-by-model.csv": "120a3c3f9adf9c709a8802f1572a2b8b154c501ad2460895e7dfe0820d886652",
    "by-model/gpumeter-2026-11-by-model.html": "66ed84ffb9664e91e791e42905ee923e84604e8368b3386bf2ac22656385e05d",
    "by-model/gpumeter-2026-11-by-model.json": "be6df64c5061905a5480772b59acd79c43cd1abab71f8c4abcc63331c54abd01",
    "by-model/gpumeter-2026-11-lines.csv": "ef01b1329190bf3221aee267a3df6e6bd5861deeedede71a652d115b159f2cbe",
    "by-model/manifest.json": "0994b0bc2e4a67e102d2d41f7dfdf3b416b1b2c709ea5d4d00375f0c5fb9794a",
    "by-mig_profile/gpumeter-2026-11-by-mig_profile.csv": "625d40261fe9d7cc555f428cf8d6bca8d5a05e4a4758558c5228f4bf07969c6d",
    "by-mig_profile/gpumeter-2026-11-by-mig_profile.json": "f2c2bb40a74544fea3fef0f35cf37795f7edd308dbfcaf3ba86e199ec721c6eb",
    "by-mig_profile/gpumeter-2026-11-lines.csv": "ef01b1329190bf3221aee267a3df6e6bd5861deeedede71a652d115b159f2cbe",
    "by-mig_profile/manifest.json": "4f722bf9cccda828a959af3e8cb89dd36dde5867589dd485bcae7476dd117ccf",
    "allocations/gpumeter-allocations-2026-11.csv": "06233731de08a81b9886ac87e7f4465837dd93e37486af4eac15c61634bcb3ea",
    "allocations/gpumeter-allocations-2026-11.html": "78f7c20b58adb331204bd68084ace1c8e5fe6329fb5e8cb439ff305740d73b17",
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
