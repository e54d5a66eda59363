"""gpumeter: NVIDIA GPU and MIG monitoring, alerting and chargeback.

One import namespace. The parts live in the repository's top-level folders and are installed under
this package (``pyproject.toml`` maps ``exporter/`` to ``gpumeter.exporter`` and so on); this folder
holds what sits above them: the command line, the metric contract they all share, and the
composition root that wires billing to reports.
"""

from importlib.metadata import PackageNotFoundError, version

try:  # the one place the version is written is pyproject.toml
    __version__ = version("gpumeter")
except PackageNotFoundError:  # pragma: no cover - running from a tree that was never installed
    __version__ = "0+unknown"


def main(argv: list[str] | None = None) -> int:
    """The ``gpumeter`` console command (see :mod:`gpumeter.cli`)."""
    from gpumeter.cli import main as cli_main

    return cli_main(argv)
