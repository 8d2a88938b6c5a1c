"""Checks on a submitted icon, before any judge sees it: "zero before the judge".

A submission that is missing, empty, oversized, not XML, not an `<svg>` document, unrenderable or
blank scores 0 with its reasons, and the judge is never called. Each reason is a short stable code,
then `": "` and a detail for people: `"not_xml: line 1, column 4: mismatched tag"`. `reason_code()`
gives the code back.

This module is standard library only and runs on Python >= 3.11, because its SOURCE is also
shipped into the sandbox as the library of the preview helper (the sandbox has the system
`python3` and no venv): the agent's preview and the server's grading share one implementation.
For the same reason it holds the pure Chromium command-line and page builders that the server's
renderer (render.py) and the preview both use, and a small PNG decoder/encoder (zlib and filter
reconstruction, 8-bit, non-interlaced).
"""

from __future__ import annotations

import os
import shutil
import struct
import xml.parsers.expat
import zlib
from collections import Counter
from dataclasses import dataclass, field

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


# -- PNG ------------------------------------------------------------------------------------

_PNG_SIG = b"\x89PNG\r\n\x1a\n"
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel


class PngError(ValueError):
    pass


def _unfilter(raw: bytes, width: int, height: int, bpp: int) -> bytearray:
    stride = width * bpp
    if len(raw) < height * (stride + 1):
        raise PngError("truncated image data")
    out = bytearray(height * stride)
    prev = bytearray(stride)
    pos = 0
    for y in range(height):
        ftype = raw[pos]
        line = bytearray(raw[pos + 1 : pos + 1 + stride])
        pos += stride + 1
        if ftype == 0:
            pass
        elif ftype == 1:  # Sub
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:  # Up
            line = bytearray([(a + b) & 0xFF for a, b in zip(line, prev)])
        elif ftype == 3:  # Average
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:  # Paeth
            for i in range(stride):
                if i >= bpp:
                    a, c = line[i - bpp], prev[i - bpp]
                else:
                    a = c = 0
                b = prev[i]
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                if pa <= pb and pa <= pc:
                    pred = a
                elif pb <= pc:
                    pred = b
                else:
                    pred = c
                line[i] = (line[i] + pred) & 0xFF
        else:
            raise PngError(f"bad filter type {ftype} on row {y}")
        out[y * stride : (y + 1) * stride] = line
        prev = line
    return out


def decode_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, pixels): pixels are RGB, 3 bytes each, row-major, with any alpha composited
    over white. 8-bit, non-interlaced PNGs (gray, RGB, palette, with or without alpha)."""
    if not data.startswith(_PNG_SIG):
        raise PngError("not a PNG file")
    pos = len(_PNG_SIG)
    header = None
    palette = b""
    trns = b""
    idat = []
    while pos + 8 <= len(data):
        length, ctype = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if ctype == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif ctype == b"PLTE":
            palette = chunk
        elif ctype == b"tRNS":
            trns = chunk
        elif ctype == b"IDAT":
            idat.append(chunk)
        elif ctype == b"IEND":
            break
    if header is None:
        raise PngError("no IHDR chunk")
    width, height, depth, color_type, _, _, interlace = header
    if depth != 8 or interlace != 0 or color_type not in _CHANNELS:
        raise PngError(f"unsupported PNG: bit depth {depth}, colour type {color_type}, interlace {interlace}")
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as e:
        raise PngError(f"corrupt image data: {e}") from e
    n = _CHANNELS[color_type]
    px = _unfilter(raw, width, height, n)
    if color_type == 2:
        return width, height, bytes(px)
    if color_type == 0:
        return width, height, bytes(v for g in px for v in (g, g, g))
    if color_type == 3:
        lut = []
        for i in range(256):
            r, g, b = palette[3 * i : 3 * i + 3] or b"\0\0\0"
            a = trns[i] if i < len(trns) else 255
            lut.append(bytes(_over_white(c, a) for c in (r, g, b)))
        return width, height, b"".join(lut[i] for i in px)
    if color_type == 4:
        out = bytearray()
        for i in range(0, len(px), 2):
            v = _over_white(px[i], px[i + 1])
            out += bytes((v, v, v))
        return width, height, bytes(out)
    # RGBA
    if all(a == 255 for a in px[3::4]):
        rgb = bytearray(width * height * 3)
        rgb[0::3], rgb[1::3], rgb[2::3] = px[0::4], px[1::4], px[2::4]
        return width, height, bytes(rgb)
    out = bytearray(width * height * 3)
    for j, i in enumerate(range(0, len(px), 4)):
        a = px[i + 3]
        out[3 * j], out[3 * j + 1], out[3 * j + 2] = (_over_white(px[i + k], a) for k in range(3))
    return width, height, bytes(out)


def _over_white(c: int, a: int) -> int:
    return (c * a + 255 * (255 - a) + 127) // 255


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG (no filtering)."""
    stride = width * 3
    raw = b"".join(b"\0" + rgb[y * stride : (y + 1) * stride] for y in range(height))

    def chunk(ctype: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", zlib.crc32(ctype + body) & 0xFFFFFFFF)

    return (
        _PNG_SIG
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw, 6))
        + chunk(b"IEND", b"")
    )


def paste_centered(width: int, height: int, png: bytes, background: tuple[int, int, int] = (255, 255, 255)) -> bytes:
    """`png` centred on a width x height canvas of `background` (how `object-fit: contain` places
    an image), as a new PNG. Used to bring resvg's fitted output to the fixed render size."""
    w, h, px = decode_png(png)
    if (w, h) == (width, height):
        return png
    if w > width or h > height:
        raise PngError(f"{w}x{h} does not fit in {width}x{height}")
    canvas = bytearray(bytes(background) * (width * height))
    x0, y0 = (width - w) // 2, (height - h) // 2
    for y in range(h):
        start = ((y0 + y) * width + x0) * 3
        canvas[start : start + w * 3] = px[y * w * 3 : (y + 1) * w * 3]
    return encode_png(width, height, bytes(canvas))


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
    return "#%02x%02x%02x" % c


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


def page_reasons(
    png: bytes | None,
    width: int | None = None,
    height: int | None = None,
    tolerance: float = BLANK_FRACTION,
) -> list[str]:
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


# -- Chromium (pure builders, shared by render.py and the sandbox preview) ---------------------

CHROMIUM_ENV = "HARNESS_ENV_CHROMIUM"
CHROMIUM_INSTALL_HINT = (
    "install it with `apt-get install chromium` (the project's ./dev does), set HARNESS_ENV_CHROMIUM "
    "to its path, or choose the pure-Python renderer explicitly with renderer=\"resvg\""
)

# The SVG is shown through <img>, never inlined or opened as a document: an SVG used as an image
# runs no script, loads no external resource (no network, no local file) and cannot navigate, so
# the page only ever draws the file's own shapes. object-fit: contain scales it to fit the
# viewport keeping its aspect ratio, centred on the white page.
WRAPPER_HTML = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><style>
html, body {{ margin: 0; padding: 0; width: 100%; height: 100%; overflow: hidden; background: {background}; }}
img {{ display: block; width: 100%; height: 100%; object-fit: contain; }}
</style></head><body><img src="{svg_name}" alt=""></body></html>
"""


def wrapper_html(svg_name: str = "icon.svg", background: str = "#ffffff") -> str:
    return WRAPPER_HTML.format(svg_name=svg_name, background=background)


def find_chromium(environ: dict[str, str] | None = None) -> str | None:
    """HARNESS_ENV_CHROMIUM, else /usr/bin/chromium, else chromium / chromium-browser on PATH."""
    env = os.environ if environ is None else environ
    explicit = env.get(CHROMIUM_ENV)
    if explicit:
        return explicit if os.path.isfile(explicit) and os.access(explicit, os.X_OK) else None
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    path = env.get("PATH")
    return shutil.which("chromium", path=path) or shutil.which("chromium-browser", path=path)


def chromium_tmp_root(environ: dict[str, str] | None = None) -> str:
    """Where to make Chromium's temporary directory (its TMPDIR too). Chromium puts a Unix socket
    at $TMPDIR/org.chromium.Chromium.XXXXXX/SingletonSocket and aborts when that path exceeds the
    108-byte limit, as it does in a sandbox whose TMPDIR is deep (pytest's, for one); then /tmp
    (private to a bubblewrap sandbox) is used when writable."""
    env = os.environ if environ is None else environ
    tmp = env.get("TMPDIR") or "/tmp"
    if len(os.path.abspath(tmp)) <= 40 or not os.access("/tmp", os.W_OK):
        return tmp
    return "/tmp"


def chromium_argv(chromium: str, page: str, out_png: str, user_data_dir: str, width: int, height: int) -> list[str]:
    """Headless Chromium screenshotting `page` (a local HTML file) at width x height."""
    return [
        chromium,
        "--headless",
        "--no-sandbox",  # under bubblewrap or in a container the setuid/userns sandbox is unavailable
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--disable-dev-shm-usage",  # a sandbox's /dev/shm can be tiny or missing
        "--hide-scrollbars",
        "--mute-audio",
        "--force-device-scale-factor=1",
        "--host-resolver-rules=MAP * ~NOTFOUND",  # nothing should go to the network
        f"--user-data-dir={user_data_dir}",
        f"--screenshot={out_png}",
        f"--window-size={width},{height}",
        "file://" + os.path.abspath(page),
    ]


def read_screenshot(path: str, returncode: int | None, stderr: bytes) -> tuple[bytes, str | None]:
    """The PNG a Chromium run wrote to `path`, or why there is none (its last stderr lines)."""
    try:
        with open(path, "rb") as f:
            return f.read(), None
    except OSError:
        tail = stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        return b"", f"Chromium wrote no screenshot (exit {returncode}): {' | '.join(tail)}"
