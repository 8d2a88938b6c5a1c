"""Zero-before-the-judge checks: each bad kind of submission gives its reason code."""

import pytest

from harness_env.families.svg_icon import checks
from harness_env.families.svg_icon.checks import external_refs, image_stats, inspect_svg, is_blank, page_reasons, page_valid, reason_code
from harness_env.families.svg_icon.pngcodec import encode_png

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


def test_entity_expansion_is_refused_before_anything_expands():
    lol = '<?xml version="1.0"?>\n<!DOCTYPE svg [\n<!ENTITY a "lollollollollollollollollollol">\n'
    for i in range(1, 10):
        lol += f'<!ENTITY {chr(97 + i)} "' + f"&{chr(96 + i)};" * 10 + '">\n'
    lol += ']>\n<svg xmlns="http://www.w3.org/2000/svg"><text>&j;</text></svg>'
    reasons = inspect_svg(lol)
    assert codes(reasons) == ["not_xml"] and "DOCTYPE" in reasons[0]  # refused at the DOCTYPE, before any entity is expanded


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


def test_reason_codes_are_stable():
    assert checks.REASON_CODES == ("missing", "empty", "oversized", "not_xml", "not_svg_root", "unrenderable", "blank")
    assert reason_code("blank: 0.0% drawn") == "blank"
