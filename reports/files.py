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
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

# what a file is given as: its bytes or text whole, or a function giving its text in parts (a month of
# 10,000 GPUs is a FOCUS file of ~1.4 GB: written as it is made, it is never held whole)
Content = str | bytes | Callable[[], Iterable[str]]


class ReportWriteError(RuntimeError):
    """A report file could not be written. One line naming the path and the errno; ``written`` are
    the files already in place (whole), ``unwritten`` the ones not (the failed one first)."""

    def __init__(self, path: Path, exc: OSError, written: list[str], unwritten: list[str]):
        self.path, self.errno, self.written, self.unwritten = path, exc.errno, written, unwritten
        code = f"[Errno {exc.errno}] " if exc.errno is not None else ""
        super().__init__(f"{path}: cannot write the report file: {code}{exc.strerror or exc}")


def write_atomically(path: Path, data: bytes | Iterable[bytes]) -> str:
    """``data`` (bytes, or its parts in order) under ``path``, whole: written to a temporary file
    beside it, fsynced, renamed. Returns its SHA-256 (hex). OSError after removing the temporary file;
    ``path`` is then as it was (so too when making a part raises)."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as file:
            for part in (data,) if isinstance(data, bytes) else data:
                digest.update(part)
                file.write(part)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, 0o644)  # mkstemp makes it 0600; a report is read by others
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return digest.hexdigest()


def _encoded(content: Content) -> bytes | Iterable[bytes]:
    if isinstance(content, str):
        return content.encode("utf-8")
    if isinstance(content, bytes):
        return content
    return (part.encode("utf-8") for part in content())


def write_files(out: Path, texts: Mapping[str, Content]) -> dict[str, str]:
    """Write each of ``texts`` (name -> content: text, bytes, or a function giving the text's parts)
    into ``out`` with `write_atomically`, in order; returns {name: sha256 hex}, sorted.
    ReportWriteError at the first that cannot be written."""
    checksums: dict[str, str] = {}
    names = list(texts)
    for i, name in enumerate(names):
        try:
            checksums[name] = write_atomically(out / name, _encoded(texts[name]))
        except OSError as exc:
            raise ReportWriteError(out / name, exc, names[:i], names[i:]) from None
    return dict(sorted(checksums.items()))
