"""Headless Chromium (Debian package `chromium`) for the HTML report: DOM after the page's scripts ran,
the browser console, and screenshots. A missing chromium fails the test (never skips)."""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path

from tests.support.servers import require_binary

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--virtual-time-budget=20000",  # let the page's scripts and plotly's promises finish
]
_CONSOLE = re.compile(r":CONSOLE[:(\]]")
_HTML_ATTRS = re.compile(r"<html([^>]*)>", re.IGNORECASE)
_ATTR = re.compile(r'([\w-]+)="([^"]*)"')


@dataclass
class PageRun:
    dom: str
    console: list[str]  # every console message the page produced (errors, uncaught exceptions, logs)
    root_attrs: dict[str, str]  # attributes of <html> after the scripts ran
    title: str


def load(html: Path, workdir: Path, timeout: float = 90) -> PageRun:
    chromium = require_binary("chromium")
    profile = workdir / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    argv = [
        chromium,
        *FLAGS,
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        "--dump-dom",
        html.resolve().as_uri(),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0 or "<html" not in proc.stdout:
        raise AssertionError(f"chromium failed ({proc.returncode}): {proc.stderr[-3000:]}")
    console = [line for line in proc.stderr.splitlines() if _CONSOLE.search(line)]
    match = _HTML_ATTRS.search(proc.stdout)
    attrs = dict(_ATTR.findall(match.group(1))) if match else {}
    title = re.search(r"<title>(.*?)</title>", proc.stdout, re.S)
    return PageRun(proc.stdout, console, attrs, title.group(1) if title else "")


def screenshot(html: Path, png: Path, workdir: Path, size: str = "1400,2000", timeout: float = 90) -> Path:
    chromium = require_binary("chromium")
    profile = workdir / "chromium-profile-shot"
    profile.mkdir(parents=True, exist_ok=True)
    argv = [
        chromium,
        *FLAGS,
        f"--user-data-dir={profile}",
        f"--screenshot={png}",
        f"--window-size={size}",
        html.resolve().as_uri(),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0 or not png.exists():
        raise AssertionError(f"chromium screenshot failed ({proc.returncode}): {proc.stderr[-3000:]}")
    return png


def png_summary(path: Path) -> tuple[int, int, float]:
    """(width, height, share of non-white bytes in the decoded scanlines) of an 8-bit PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    # filter bytes make this approximate, which is enough to tell a blank page from a drawn one
    non_white = sum(1 for b in raw[:: max(1, len(raw) // 200_000)] if b not in (0, 255))
    return width, height, non_white / len(raw[:: max(1, len(raw) // 200_000)])
