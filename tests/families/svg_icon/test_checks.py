"""Zero-before-the-judge checks: each bad kind of submission gives its reason code."""

import struct
import time
import zlib

import pytest

from harness_env.families.svg_icon import checks
from harness_env.families.svg_icon.checks import (
    decode_png,
    encode_png,
    external_refs,
    image_stats,
    inspect_svg,
    is_blank,
    page_reasons,
    page_valid,
    paste_centered,
    reason_code,
)

GOOD = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"><rect width="5" height="5"/></svg>'


def codes(reasons):
    return [reason_code(r) for r in reasons]


@pytest.mark.parametrize(
    "text, code",
    [
        (None, "missing"),
        ("", "empty"),
        ("  \n\t", "empty"),
        (b"", "empty"),
        ("<svg", "not_xml"),
        ("just some words", "not_xml"),
        ('<svg xmlns="http://www.w3.org/2000/svg"><g></svg>', "not_xml"),
        ("<html><body/></html>", "not_svg_root"),
        ('<x:svg xmlns:x="http://example.com/not-svg"/>', "not_svg_root"),
        ('<svg viewBox="0 0 1 1"><rect/></svg>', "not_svg_root"),  # no xmlns: browsers draw nothing
    ],
)
def test_bad_sources_have_their_reason(text, code):
    reasons = inspect_svg(text)
    assert codes(reasons) == [code], reasons


def test_good_sources_pass():
    assert inspect_svg(GOOD) == []
    assert inspect_svg(GOOD.encode()) == []
    assert inspect_svg('<?xml version="1.0"?>\n<!-- hi -->\n' + GOOD) == []
    assert inspect_svg('<s:svg xmlns:s="http://www.w3.org/2000/svg"><s:rect width="1" height="1"/></s:svg>') == []


def test_oversized_is_refused_before_parsing():
    big = GOOD[:-6] + "<!--" + "x" * 300_000 + "--></svg>"
    assert codes(inspect_svg(big)) == ["oversized"]
    assert codes(inspect_svg(GOOD, max_bytes=10)) == ["oversized"]
    assert "bytes, the limit is 10" in inspect_svg(GOOD, max_bytes=10)[0]


def test_entity_expansion_is_rejected_quickly():
    lol = '<?xml version="1.0"?>\n<!DOCTYPE svg [\n<!ENTITY a "lollollollollollollollollollol">\n'
    for i in range(1, 10):
        lol += f'<!ENTITY {chr(97 + i)} "' + f"&{chr(96 + i)};" * 10 + '">\n'
    lol += ']>\n<svg xmlns="http://www.w3.org/2000/svg"><text>&j;</text></svg>'
    started = time.monotonic()
    reasons = inspect_svg(lol)
    assert time.monotonic() - started < 0.5
    assert codes(reasons) == ["not_xml"] and "DOCTYPE" in reasons[0]


def test_external_entities_are_rejected():
    xxe = '<?xml version="1.0"?><!DOCTYPE svg [<!ENTITY x SYSTEM "file:///etc/passwd">]><svg xmlns="http://www.w3.org/2000/svg">&x;</svg>'
    assert codes(inspect_svg(xxe)) == ["not_xml"]


def test_not_xml_detail_says_where():
    (r,) = inspect_svg('<svg xmlns="http://www.w3.org/2000/svg">\n<g></svg>')
    assert r.startswith("not_xml: line 2, column") and "mismatched tag" in r


def test_external_refs():
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink">'
        '<use href="#a"/><image href="data:image/png;base64,AAAA"/><image xlink:href="file:///etc/x.png"/>'
        '<image href="https://example.com/a.png"/></svg>'
    )
    assert external_refs(svg) == ["file:///etc/x.png", "https://example.com/a.png"]
    assert external_refs(GOOD) == []


# -- PNG --------------------------------------------------------------------------------------


def _filtered_png(width, height, pixels, channels, color_type, ftypes):
    """A PNG whose rows use the given filter types (cycled): exercises every reconstruction."""
    stride = width * channels
    rows = [pixels[y * stride : (y + 1) * stride] for y in range(height)]
    out = bytearray()
    prev = bytes(stride)
    for y, row in enumerate(rows):
        f = ftypes[y % len(ftypes)]
        enc = bytearray()
        for i, x in enumerate(row):
            a = row[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 0:
                pred = 0
            elif f == 1:
                pred = a
            elif f == 2:
                pred = b
            elif f == 3:
                pred = (a + b) // 2
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            enc.append((x - pred) & 0xFF)
        out += bytes([f]) + enc
        prev = row

    def chunk(t, body):
        return struct.pack(">I", len(body)) + t + body + struct.pack(">I", zlib.crc32(t + body))

    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(bytes(out)))
        + chunk(b"IEND", b"")
    )


def test_decode_every_filter_rgb():
    w, h = 7, 10
    px = bytes((x * 37 + y * 11 + c * 91) % 256 for y in range(h) for x in range(w) for c in range(3))
    png = _filtered_png(w, h, px, 3, 2, [0, 1, 2, 3, 4])
    assert decode_png(png) == (w, h, px)


def test_decode_rgba_composites_over_white():
    px = bytes([255, 0, 0, 255, 0, 0, 255, 0, 0, 0, 0, 128])  # red opaque, blue clear, black half
    png = _filtered_png(3, 1, px, 4, 6, [4])
    assert decode_png(png) == (3, 1, bytes([255, 0, 0, 255, 255, 255, 127, 127, 127]))


def test_encode_roundtrip_and_bad_input():
    px = bytes(range(256)) * 3
    assert decode_png(encode_png(16, 16, px)) == (16, 16, px)
    with pytest.raises(checks.PngError):
        decode_png(b"not a png")


def _square_png(size=100, square=(40, 60), colour=(255, 0, 0)):
    px = bytearray(b"\xff" * size * size * 3)
    for y in range(square[0], square[1]):
        for x in range(square[0], square[1]):
            px[(y * size + x) * 3 : (y * size + x) * 3 + 3] = bytes(colour)
    return encode_png(size, size, bytes(px))


def test_blank_and_stats():
    white = encode_png(100, 100, b"\xff" * 30000)
    red = encode_png(100, 100, b"\xff\x00\x00" * 10000)
    assert is_blank(white) and is_blank(red)  # uniform, whatever the colour
    speck = _square_png(square=(50, 51))  # 1 pixel of 10,000: 0.01%
    assert is_blank(speck)
    faint = _square_png(square=(20, 80), colour=(250, 250, 250))  # too close to white to count
    assert is_blank(faint)
    sq = _square_png()
    assert not is_blank(sq)
    stats = image_stats(sq)
    assert stats.background == "#ffffff"
    assert stats.bbox == (40, 40, 60, 60)
    assert stats.drawn_fraction == pytest.approx(0.04)
    assert stats.colours == [("#ff0000", pytest.approx(0.04))]


def test_page_reasons():
    sq = _square_png()
    assert page_reasons(sq, 100, 100) == [] and page_valid(sq, 100, 100)
    assert codes(page_reasons(None)) == ["unrenderable"]
    assert codes(page_reasons(b"garbage")) == ["unrenderable"]
    assert codes(page_reasons(sq, 512, 512)) == ["unrenderable"]
    (r,) = page_reasons(encode_png(10, 10, b"\xff" * 300), 10, 10)
    assert reason_code(r) == "blank" and "#ffffff" in r
    assert not page_valid(encode_png(10, 10, b"\xff" * 300))


def test_paste_centered():
    small = encode_png(2, 1, b"\x00\x00\x00" * 2)
    w, h, px = decode_png(paste_centered(4, 3, small))
    assert (w, h) == (4, 3)
    black = [i for i in range(12) if px[3 * i : 3 * i + 3] == b"\0\0\0"]
    assert black == [5, 6]  # row 1, columns 1-2


def test_reason_codes_are_stable():
    assert checks.REASON_CODES == ("missing", "empty", "oversized", "not_xml", "not_svg_root", "unrenderable", "blank")
    assert reason_code("blank: 0.0% drawn") == "blank"
