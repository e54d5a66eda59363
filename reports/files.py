"""Report files written whole or not at all.

Each file goes to a temporary name beside its final one (same directory, so the same filesystem),
is flushed to disk and then renamed over the final name: a reader, a sync job or the next month's
run sees the old file or the new one, never a cut-off one. On a full filesystem `gpumeter report
--out` ended in a traceback and left a truncated HTML under its final name, and the scheduled job
left a truncated HTML and a 0-byte health HTML in the folder while logging "rendered 0 file(s)".
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path


class ReportWriteError(RuntimeError):
    """A report file could not be written. One line naming the path and the errno; ``written`` are
    the files already in place (whole), ``unwritten`` the ones not (the failed one first)."""

    def __init__(self, path: Path, exc: OSError, written: list[str], unwritten: list[str]):
        self.path, self.errno, self.written, self.unwritten = path, exc.errno, written, unwritten
        code = f"[Errno {exc.errno}] " if exc.errno is not None else ""
        super().__init__(f"{path}: cannot write the report file: {code}{exc.strerror or exc}")


def write_atomically(path: Path, data: bytes) -> None:
    """``data`` under ``path``, whole: written to a temporary file beside it, fsynced, renamed.
    OSError after removing the temporary file; ``path`` is then as it was."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o644)  # mkstemp makes it 0600; a report is read by others
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def write_files(out: Path, texts: Mapping[str, str | bytes]) -> dict[str, str]:
    """Write each of ``texts`` (name -> content) into ``out`` with `write_atomically`, in order;
    returns {name: sha256 hex}, sorted. ReportWriteError at the first that cannot be written."""
    checksums: dict[str, str] = {}
    names = list(texts)
    for i, name in enumerate(names):
        text = texts[name]
        data = text.encode("utf-8") if isinstance(text, str) else text
        try:
            write_atomically(out / name, data)
        except OSError as exc:
            raise ReportWriteError(out / name, exc, names[:i], names[i:]) from None
        checksums[name] = hashlib.sha256(data).hexdigest()
    return dict(sorted(checksums.items()))
