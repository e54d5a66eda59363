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


class WrittenApart:
    """A file another process writes (`reports.sums_worker`) to a temporary name beside its final one,
    made here (`temporary_beside`) so that it is removed here whatever becomes of that process.
    ``written`` waits for it and gives its SHA-256; `write_files` then renames it into place in its
    turn, or removes it."""

    def __init__(self, temporary: Path, written: Callable[[], str]):
        self.temporary, self._written = temporary, written

    def commit(self, path: Path) -> str:
        digest = self._written()
        os.replace(self.temporary, path)
        return digest

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.temporary)


# what a file is given as: its bytes or text whole, a function giving its text in parts (a month of
# 10,000 GPUs is a FOCUS file of ~1.4 GB: written as it is made, it is never held whole), or a file
# another process writes
Content = str | bytes | Callable[[], Iterable[str]] | WrittenApart


def temporary_beside(path: Path) -> Path:
    """An empty file of mode 0644 for ``path``'s content, in its folder, named as `write_atomically`
    names its own."""
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    os.close(fd)
    os.chmod(temporary, 0o644)  # mkstemp makes it 0600; a report is read by others
    return Path(temporary)


def write_whole(path: Path, data: Iterable[bytes]) -> str:
    """``data``'s parts in order into the existing file ``path``, fsynced; their SHA-256 (hex)."""
    digest = hashlib.sha256()
    with open(path, "wb") as file:
        for part in data:
            digest.update(part)
            file.write(part)
        file.flush()
        os.fsync(file.fileno())
    return digest.hexdigest()


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
    temporary = temporary_beside(path)
    try:
        digest = write_whole(temporary, (data,) if isinstance(data, bytes) else data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return digest


def _encoded(content: str | bytes | Callable[[], Iterable[str]]) -> bytes | Iterable[bytes]:
    if isinstance(content, str):
        return content.encode("utf-8")
    if isinstance(content, bytes):
        return content
    return (part.encode("utf-8") for part in content())


def write_files(out: Path, texts: Mapping[str, Content]) -> dict[str, str]:
    """Write each of ``texts`` (name -> content: text, bytes, a function giving the text's parts, or
    a file written apart) into ``out`` with `write_atomically`, in order; returns {name: sha256 hex},
    sorted. ReportWriteError at the first that cannot be written; a file written apart and not put in
    place is removed, whatever stopped the writing."""
    checksums: dict[str, str] = {}
    names = list(texts)
    try:
        for i, name in enumerate(names):
            content = texts[name]
            try:
                if isinstance(content, WrittenApart):
                    checksums[name] = content.commit(out / name)
                else:
                    checksums[name] = write_atomically(out / name, _encoded(content))
            except OSError as exc:
                raise ReportWriteError(out / name, exc, names[:i], names[i:]) from None
    finally:
        for name in names[len(checksums) :]:
            content = texts[name]
            if isinstance(content, WrittenApart):
                content.discard()
    return dict(sorted(checksums.items()))
