"""The layers, checked on the imports of every module (docs/architecture.md, "Layout").

gpumeter.contract, gpumeter.third_party, gpumeter.web and gpumeter.process are leaves every part may use; the parts (exporter, billing,
reports, dashboards, alerts, deploy, and the simulator, gpumeter.simulator) sit above them; billing sits below
reports; the command (gpumeter.cli) and the composition root (gpumeter.service) sit on top, and nothing
imports them. The simulator stands in for NVML, the kubelet and the Kubernetes API below the exporter, so it
may use the exporter's wire formats (the kubelet's proto, DRA's names); the exporter reaches it only where
`--simulate` composes it (SIMULATOR_COMPOSITION), billing and reports never.
The concrete SQL ledger is reached through the ledger package's factory, except by the root.
Inside gpumeter.web each module imports only the modules below it in WEB_LAYERS.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("exporter", "billing", "reports", "dashboards", "alerts", "deploy", "simulator")
# Where a simulated node is composed in place of a real one: the exporter's --simulate, the doctor's
# --simulate, `gpumeter docs models` (the simulated models' tables), and the demo's clusters.
SIMULATOR_COMPOSITION = (
    "gpumeter.exporter.app",
    "gpumeter.exporter.doctor",
    "gpumeter.exporter.cli",
    "gpumeter.deploy.demo",
)
SQL_LEDGER = "gpumeter.billing.ledger.sqlalchemy"
LEAVES = ("gpumeter.contract", "gpumeter.third_party", "gpumeter.web", "gpumeter.process")
# gpumeter.web's modules, lowest first (exporter-toolkit's web/ is the model): the errors and addresses,
# TLS settings and context, the web config that names them, access control over a config, one
# connection's HTTP, the event loop that hands connections to it, the server over all of them. A module
# imports only those before it, type-only imports aside (the event loop names the Server it serves).
WEB_LAYERS = ("errors", "listen", "tls", "config", "auth", "wsgi", "event_loop", "server")


def _module_name(path: Path, folders: dict[str, str]) -> str:
    relative = path.relative_to(ROOT)
    package = folders[relative.parts[0]]
    rest = [p for p in relative.with_suffix("").parts[1:] if p != "__init__"]
    return ".".join([package, *rest])


def imports_of(source: str, module: str, *, type_only: bool = True) -> set[str]:
    """Every module ``source`` imports, absolute, function-local imports included; without those under
    ``if TYPE_CHECKING:`` when ``type_only`` is false."""
    found = set()
    package = module.rsplit(".", 1)[0]
    tree = ast.parse(source)
    if not type_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parents = package.split(".")
                base = ".".join([*parents[: len(parents) - node.level + 1], base]).strip(".")
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def violations(module: str, imported: set[str]) -> list[str]:
    """The layering rules broken by ``module`` importing ``imported``."""

    def under(name: str, prefix: str) -> bool:
        return name == prefix or name.startswith(prefix + ".")

    out = []
    part = module.split(".")[1] if module.count(".") >= 1 else ""
    for name in sorted(imported):
        if part in PARTS and any(under(name, top) for top in ("gpumeter.cli", "gpumeter.service")):
            out.append(f"{module} imports {name}: a part never imports the command or the composition root")
        if (
            under(name, "gpumeter.simulator")
            and part in PARTS
            and part != "simulator"
            and not any(under(module, root) for root in SIMULATOR_COMPOSITION)
        ):
            out.append(f"{module} imports {name}: the simulator is composed only by --simulate and the demo")
        if part == "simulator" and any(
            under(name, f"gpumeter.{p}") for p in ("billing", "reports", "dashboards", "alerts")
        ):
            out.append(
                f"{module} imports {name}: the simulator stands in below the exporter and writes series, not bills"
            )
        if part == "billing" and under(name, "gpumeter.reports"):
            out.append(f"{module} imports {name}: billing sits below reports")
        if any(under(module, leaf) for leaf in LEAVES) and any(under(name, f"gpumeter.{p}") for p in PARTS):
            out.append(f"{module} imports {name}: the contract, web and process modules are leaves")
        if under(name, SQL_LEDGER) and not (
            under(module, "gpumeter.billing.ledger") or module in ("gpumeter.service", "gpumeter.cli")
        ):
            out.append(
                f"{module} imports {name}: use gpumeter.billing.ledger.open_ledger and the Ledger interface"
            )
    return out


def web_violations(module: str, imported: set[str]) -> list[str]:
    """Inside gpumeter.web: a module importing one at or above its own place in WEB_LAYERS."""
    if not module.startswith("gpumeter.web.") or module.split(".")[2] not in WEB_LAYERS:
        return []
    place = WEB_LAYERS.index(module.split(".")[2])
    return [
        f"{module} imports {name}: in gpumeter.web, {WEB_LAYERS[place]} sits below {name.split('.')[2]}"
        for name in sorted(imported)
        if name.startswith("gpumeter.web.")
        and name.split(".")[2] in WEB_LAYERS
        and WEB_LAYERS.index(name.split(".")[2]) >= place
        and name.split(".")[2] != WEB_LAYERS[place]
    ]


def test_the_web_package_is_layered_as_declared():
    modules = installed_modules()
    web = {name.split(".")[2] for name in modules if name.startswith("gpumeter.web.")}
    assert web == set(WEB_LAYERS), "a module of gpumeter.web missing from WEB_LAYERS, or gone"
    broken = [
        problem
        for name, path in sorted(modules.items())
        for problem in web_violations(
            name, imports_of(path.read_text(encoding="utf-8"), name, type_only=False)
        )
    ]
    assert broken == []
    assert web_violations("gpumeter.web.tls", imports_of("from .server import Server", "gpumeter.web.tls"))


def installed_modules() -> dict[str, Path]:
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    by_folder = {folder: package for package, folder in folders.items()}
    modules = {}
    for folder in by_folder:
        for path in (ROOT / folder).rglob("*.py"):
            modules[_module_name(path, by_folder)] = path
    return modules


def test_no_module_breaks_the_layers():
    modules = installed_modules()
    assert "gpumeter.service" in modules and "gpumeter.billing.ledger.memory" in modules
    broken = [
        problem
        for name, path in sorted(modules.items())
        for problem in violations(name, imports_of(path.read_text(encoding="utf-8"), name))
    ]
    assert broken == []


@pytest.mark.parametrize(
    ("module", "source", "rule"),
    [
        ("gpumeter.billing.ingest", "from gpumeter.reports.schedule import run_monthly", "below reports"),
        ("gpumeter.billing.cli", "def f():\n    from gpumeter.service import serve", "composition root"),
        ("gpumeter.reports.run", "from gpumeter.billing.ledger.sqlalchemy import SqlLedger", "open_ledger"),
        ("gpumeter.reports.run", "from ..billing.ledger import sqlalchemy", "open_ledger"),
        ("gpumeter.contract", "import gpumeter.exporter.catalog", "leaves"),
        ("gpumeter.web.server", "from gpumeter.billing import metrics", "leaves"),
        ("gpumeter.exporter.sampler", "from gpumeter.simulator.nvml import SimulatedNvml", "composed only"),
        ("gpumeter.billing.ingest", "from gpumeter.simulator import history", "composed only"),
        ("gpumeter.simulator.history", "from gpumeter.billing.models import GpuHour", "writes series"),
    ],
)
def test_the_check_catches_a_bad_import(module, source, rule):
    problems = violations(module, imports_of(source, module))
    assert problems and rule in problems[0]


def test_what_is_allowed_passes():
    assert (
        violations(
            "gpumeter.service",
            imports_of("from gpumeter.billing.ledger.sqlalchemy import SqlLedger", "gpumeter.service"),
        )
        == []
    )
    assert (
        violations(
            "gpumeter.reports.run",
            imports_of("from gpumeter.billing.ledger import open_ledger", "gpumeter.reports.run"),
        )
        == []
    )
