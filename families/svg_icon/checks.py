"""Checks on a submitted icon, before any judge sees it: "zero before the judge".

A submission that is missing, empty, oversized, not XML, not an `<svg>` document, unrenderable or
blank scores 0 with its reasons, and the judge is never called. Each reason is a short stable code,
then `": "` and a detail for people: `"not_xml: line 1, column 4: mismatched tag"`. `reason_code()`
gives the code back. Two kinds of check live here: on the SVG source (parsed safely with expat),
and on the rendered page's pixels (blank, wrong size); the PNG format itself is pngcodec.py's, and
the browser that renders the page is chromium.py's.

This module is standard library only and runs on Python >= 3.11, because its SOURCE is also
shipped into the sandbox as the library of the preview helper (the sandbox has the system
`python3` and no venv): the agent's preview and the server's grading share one implementation.
"""

from __future__ import annotations

import xml.parsers.expat
from collections import Counter
from dataclasses import dataclass, field

if __package__:
    from .pngcodec import PngError, decode_png
else:  # shipped into the sandbox: pngcodec.py sits next to this file (see preview.preview_files)
    from pngcodec import PngError, decode_png  # type: ignore[no-redef]

SVG_NS = "http://www.w3.org/2000/svg"
DEFAULT_MAX_BYTES = 256 * 1024
DEFAULT_SIZE = (512, 512)

# Reason codes (stable: rewards, dashboards and tests key on them).
MISSING = "missing"
EMPTY = "empty"
OVERSIZED = "oversized"
NOT_XML = "not_xml"
NOT_SVG_ROOT = "not_svg_root"
UNRENDERABLE = "unrenderable"
BLANK = "blank"
REASON_CODES = (MISSING, EMPTY, OVERSIZED, NOT_XML, NOT_SVG_ROOT, UNRENDERABLE, BLANK)

# Blank: fewer than BLANK_FRACTION of the pixels differ from the background colour by more than
# PIXEL_THRESHOLD on some channel (0-255). Anti-aliasing noise alone stays below both.
BLANK_FRACTION = 0.002
PIXEL_THRESHOLD = 24


def reason(code: str, detail: str = "") -> str:
    return f"{code}: {detail}" if detail else code


def reason_code(text: str) -> str:
    return text.split(":", 1)[0].strip()


# -- SVG source ------------------------------------------------------------------------------


class _Forbidden(Exception):
    pass


def _expat_parser() -> xml.parsers.expat.XMLParserType:
    """An expat parser that refuses DOCTYPE, entity declarations and external entities before
    anything is expanded (the protections of defusedxml: no billion laughs, no XXE)."""
    p = xml.parsers.expat.ParserCreate(namespace_separator=" ")

    def doctype(name, sysid, pubid, has_internal_subset):
        raise _Forbidden("a DOCTYPE is not allowed (no DTDs or entities in an icon)")

    def entity_decl(name, *args):
        raise _Forbidden(f"entity declaration {name!r} is not allowed")

    def external(context, base, sysid, pubid):
        raise _Forbidden("external entities are not allowed")

    p.StartDoctypeDeclHandler = doctype
    p.EntityDeclHandler = entity_decl
    p.UnparsedEntityDeclHandler = entity_decl
    p.ExternalEntityRefHandler = external
    return p


@dataclass
class _Parsed:
    root: tuple[str, str] | None = None  # (namespace, local name) of the first element
    external_refs: list[str] = field(default_factory=list)


def _parse(data: bytes) -> _Parsed:
    """Parse safely; raises _Forbidden or xml.parsers.expat.ExpatError."""
    out = _Parsed()
    p = _expat_parser()

    def start(name: str, attrs: dict[str, str]) -> None:
        if out.root is None:
            ns, _, local = name.rpartition(" ")
            out.root = (ns, local)
        for key, value in attrs.items():
            if key.rpartition(" ")[2] == "href":
                v = value.strip()
                if v and not v.startswith("#") and not v.lower().startswith("data:"):
                    out.external_refs.append(v)

    p.StartElementHandler = start
    p.Parse(data, True)
    return out


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else bytes(text)


def inspect_svg(text: str | bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> list[str]:
    """Zero reasons for the submitted SVG source (empty list: fit to render). `None` = missing.
    Oversized input is refused before it is parsed."""
    if text is None:
        return [reason(MISSING, "icon.svg was not written")]
    data = _as_bytes(text)
    if len(data) > max_bytes:
        return [reason(OVERSIZED, f"{len(data)} bytes, the limit is {max_bytes}")]
    if not data.strip():
        return [reason(EMPTY, "icon.svg is empty")]
    try:
        parsed = _parse(data)
    except _Forbidden as e:
        return [reason(NOT_XML, str(e))]
    except xml.parsers.expat.ExpatError as e:
        return [reason(NOT_XML, f"line {e.lineno}, column {e.offset + 1}: {xml.parsers.expat.errors.messages[e.code]}")]
    if parsed.root is None:
        return [reason(NOT_XML, "no root element")]
    ns, local = parsed.root
    if local != "svg":
        shown = f"{{{ns}}}{local}" if ns else local
        return [reason(NOT_SVG_ROOT, f"the root element is <{shown}>, not <svg>")]
    if ns != SVG_NS:
        got = f'xmlns="{ns}"' if ns else "no xmlns"
        return [reason(NOT_SVG_ROOT, f'<svg> needs xmlns="{SVG_NS}" (it has {got}; browsers draw nothing without it)')]
    return []


def external_refs(text: str | bytes) -> list[str]:
    """href values that point outside the document (not `#id`, not `data:`). Inside an `<img>`
    Chromium never loads them; resvg would read local files, so its renderer refuses them."""
    try:
        return _parse(_as_bytes(text)).external_refs
    except (_Forbidden, xml.parsers.expat.ExpatError):
        return []


# -- rendered pixels ------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageStats:
    width: int
    height: int
    background: str  # "#rrggbb", the most common colour
    drawn_fraction: float  # pixels away from the background (by more than PIXEL_THRESHOLD)
    bbox: tuple[int, int, int, int] | None  # x0, y0, x1, y1 (exclusive) of drawn pixels
    colours: list[tuple[str, float]]  # dominant drawn colours, with their fraction of the image


def _hex(c: tuple[int, int, int]) -> str:
    r, g, b = c
    return f"#{r:02x}{g:02x}{b:02x}"


def image_stats(png: bytes, threshold: int = PIXEL_THRESHOLD, top: int = 5, with_bbox: bool = True) -> ImageStats:
    w, h, px = decode_png(png)
    total = max(1, w * h)
    counts = Counter(zip(px[0::3], px[1::3], px[2::3]))
    bg = counts.most_common(1)[0][0] if counts else (255, 255, 255)

    def far(c: tuple[int, int, int]) -> bool:
        return max(abs(c[0] - bg[0]), abs(c[1] - bg[1]), abs(c[2] - bg[2])) > threshold

    drawn = {c: n for c, n in counts.items() if far(c)}
    drawn_total = sum(drawn.values())
    bins: dict[tuple[int, int, int], Counter] = {}
    for c, n in drawn.items():
        bins.setdefault((c[0] >> 5, c[1] >> 5, c[2] >> 5), Counter())[c] += n
    ranked = sorted(bins.values(), key=lambda b: -sum(b.values()))[:top]
    colours = [(_hex(b.most_common(1)[0][0]), sum(b.values()) / total) for b in ranked]
    bbox = None
    if drawn_total and with_bbox:
        bg_row = bytes(bg) * w
        x0, y0, x1, y1 = w, h, -1, -1
        stride = w * 3
        for y in range(h):
            row = px[y * stride : (y + 1) * stride]
            if row == bg_row:
                continue
            xs = [x for x in range(w) if far((row[3 * x], row[3 * x + 1], row[3 * x + 2]))]
            if xs:
                x0, x1 = min(x0, xs[0]), max(x1, xs[-1])
                y0, y1 = min(y0, y), max(y1, y)
        if x1 >= 0:
            bbox = (x0, y0, x1 + 1, y1 + 1)
    return ImageStats(w, h, _hex(bg), drawn_total / total, bbox, colours)


def is_blank(png: bytes, tolerance: float = BLANK_FRACTION, threshold: int = PIXEL_THRESHOLD) -> bool:
    """Near-uniform: fewer than `tolerance` of the pixels differ from the most common colour by
    more than `threshold` (0-255, on any channel)."""
    return image_stats(png, threshold=threshold, top=0, with_bbox=False).drawn_fraction < tolerance


def page_reasons(png: bytes | None, width: int | None = None, height: int | None = None, tolerance: float = BLANK_FRACTION) -> list[str]:
    """Zero reasons for a rendered page: no image, not a PNG, the wrong size, or blank."""
    if not png:
        return [reason(UNRENDERABLE, "the renderer produced no image")]
    try:
        stats = image_stats(png, top=0, with_bbox=False)
    except PngError as e:
        return [reason(UNRENDERABLE, f"the rendered image is unreadable: {e}")]
    if (width is not None and stats.width != width) or (height is not None and stats.height != height):
        return [reason(UNRENDERABLE, f"rendered {stats.width}x{stats.height}, expected {width}x{height}")]
    if stats.drawn_fraction < tolerance:
        return [reason(BLANK, f"{stats.drawn_fraction:.3%} of the pixels differ from the background {stats.background}")]
    return []


def page_valid(png: bytes | None, width: int | None = None, height: int | None = None, tolerance: float = BLANK_FRACTION) -> bool:
    return not page_reasons(png, width, height, tolerance)
