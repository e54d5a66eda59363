"""Regenerate the PodResources v1 stubs beside ``api.proto``: ``python -m gpumeter.exporter.kubelet.generate``.

The stubs are committed (the exporter needs no protoc at run time); a test regenerates them into a
temporary directory and fails when the committed files differ byte for byte. ``api.proto`` is compiled
under its repository path (``exporter/kubelet/api.proto``), so its descriptor cannot clash with another
package's ``api.proto`` in protobuf's default pool, and the import of ``api_pb2`` in the gRPC stub is
made package-relative so the stubs import as ``exporter.kubelet.api_pb2``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

__all__ = ["OUTPUTS", "PROTO", "generate", "main"]

PACKAGE_DIR = Path(__file__).resolve().parent
ROOT = PACKAGE_DIR.parent.parent
PROTO = PACKAGE_DIR / "api.proto"
OUTPUTS = ("api_pb2.py", "api_pb2_grpc.py", "api_pb2.pyi")

_ABSOLUTE_IMPORT = "from exporter.kubelet import api_pb2 as exporter_dot_kubelet_dot_api__pb2"
_RELATIVE_IMPORT = "from . import api_pb2 as exporter_dot_kubelet_dot_api__pb2"


def generate(out_dir: Path | str = PACKAGE_DIR) -> list[Path]:
    """Compile ``api.proto`` with grpc_tools' protoc and write the three stubs into ``out_dir``."""
    from grpc_tools import protoc  # dev dependency (grpcio-tools); not needed at run time

    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory(prefix="gpumeter-proto-") as tmp:
        args = [
            "grpc_tools.protoc",
            f"--proto_path={ROOT}",
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(PROTO),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {PROTO}")
        generated = Path(tmp) / PROTO.relative_to(ROOT).parent
        written = []
        for name in OUTPUTS:
            text = (generated / name).read_text()
            if name == "api_pb2_grpc.py":
                if _ABSOLUTE_IMPORT not in text:
                    raise RuntimeError(f"protoc output changed: {_ABSOLUTE_IMPORT!r} not found in {name}")
                text = text.replace(_ABSOLUTE_IMPORT, _RELATIVE_IMPORT)
            target = out_dir / name
            target.write_text(text)
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out_dir = Path(argv[0]) if argv else PACKAGE_DIR
    for path in generate(out_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
