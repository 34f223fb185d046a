"""Checks of the HTML report and the PNG files written beside it, shared by the report
tests in tests/unit and tests/integration."""

from __future__ import annotations

import re
import struct
from html.parser import HTMLParser
from pathlib import Path

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

VOID = {"meta", "img", "br", "hr", "link", "input", "rect", "line", "polyline", "path", "col"}


class HtmlChecker(HTMLParser):
    """Tag balance (every non-void element closed, in order) and every URL attribute;
    ``<a href>`` links apart (following one is the reader's choice, not a fetch)."""

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.urls: list[str] = []
        self.links: list[str] = []

    def _attrs(self, tag, attrs):
        urls = [v for k, v in attrs if k in ("src", "href", "xlink:href") and v]
        if tag == "a":
            self.links += urls
        else:
            self.urls += urls

    def handle_starttag(self, tag, attrs):
        self._attrs(tag, attrs)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self._attrs(tag, attrs)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]}")
        else:
            self.stack.pop()


def check_html(text: str) -> HtmlChecker:
    assert text.startswith("<!DOCTYPE html>")
    c = HtmlChecker()
    c.feed(text)
    c.close()
    assert c.errors == [] and c.stack == [], (c.errors, c.stack)
    # Self-contained: nothing is fetched (images are data: URLs), no scripts at all.
    assert all(u.startswith(("data:", "#")) for u in c.urls), c.urls
    # Links only to the PNG files written beside the page.
    assert all(re.fullmatch(r"[\w.-]+\.png", u) for u in c.links), c.links
    assert "<script" not in text and "<link" not in text
    assert not re.search(r"url\(\s*['\"]?https?:", text)
    return c


def series_points(text: str, css: str) -> int:
    """The points a chart series draws, over every unbroken run (a polyline each)."""
    runs = re.findall(
        rf'<polyline class="series {css}"[^>]*data-points="(\d+)"[^>]*points="([^"]*)"', text
    )
    assert runs, css
    for count, points in runs:
        assert len(points.split()) == int(count)
    return sum(int(count) for count, _ in runs)


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, after checking its signature and header chunk."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def check_pngs(text: str, html: Path) -> dict[str, Path]:
    """The page lists and links every PNG beside it; each is a real, non-empty PNG."""
    names = {
        k: html.with_name(f"{html.stem}-{k}.png")
        for k in ("throughput", "throughput-per-device", "loss", "timeline")
    }
    for p in names.values():
        assert p.exists() and p.stat().st_size > 1000, p
        w, h = png_size(p)
        assert w > 100 and h > 100
        assert f'<a href="{p.name}">{p.name}</a>' in text
    return names
