"""Where the checkout keeps what the generators write, for tests that compare committed files with a
fresh build. The installed package never points here: it reads its own package data, and generators
write only where they are told (the Makefile passes these folders)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards" / "generated"
DASHBOARD_CONFIGMAPS = ROOT / "deploy" / "kubernetes" / "base" / "dashboards"
PROMETHEUSRULE = ROOT / "deploy" / "kubernetes" / "base" / "prometheusrule.yaml"
