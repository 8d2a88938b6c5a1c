"""Rendering, checked by looking at pixels, with both renderers.

Chromium is required (the project's ./dev installs it): a missing one fails with the install hint,
it is never skipped. Chromium runs are kept few (about 1-2 s each).
"""

import asyncio
import glob
import os
import tempfile

import pytest

from harness_env.families.svg_icon import checks
from harness_env.families.svg_icon.pngcodec import decode_png
from harness_env.families.svg_icon.render import RendererMissingError, RenderSettings, chromium_path, render_png, render_png_async, resvg_fonts, zero_reasons

# A 200x100 drawing: a red 100x100 square in its middle, nothing else. Fitted into 256x256 it is
# 256x128, centred vertically (y 64..192), with the square at x 64..192.
WIDE = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 200 100"><rect x="50" y="0" width="100" height="100" fill="#ff0000"/></svg>'
TEXT_ONLY = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 100 100"><text x="5" y="60" font-size="40">Ag</text></svg>'


def pixel(png, x, y):
    w, _, px = decode_png(png)
    i = (y * w + x) * 3
    return tuple(px[i : i + 3])


def render_leftovers():
    return glob.glob(os.path.join(tempfile.gettempdir(), "harness-env-render-*"))


def assert_wide_square(png):
    assert decode_png(png)[:2] == (256, 256)
    for x, y in [(128, 128), (70, 70), (186, 186)]:
        assert pixel(png, x, y) == (255, 0, 0), (x, y)
    for x, y in [(10, 128), (245, 128), (128, 10), (128, 245), (0, 0), (255, 255)]:
        assert pixel(png, x, y) == (255, 255, 255), (x, y)
    stats = checks.image_stats(png)
    assert stats.bbox == (64, 64, 192, 192)


def test_chromium_is_installed():
    chromium_path()  # raises with `apt-get install chromium` in the message when missing


async def test_chromium_renders_fitted_and_centred_without_blocking_the_loop():
    before = set(render_leftovers())
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.create_task(ticker())
    try:
        result = await render_png_async(WIDE, renderer="chromium", size=(256, 256))
    finally:
        t.cancel()
    assert result.error is None, result.error
    assert (result.renderer, result.width, result.height) == ("chromium", 256, 256)
    assert_wide_square(result.png)
    assert ticks >= result.seconds * 100 * 0.3  # the loop kept running while Chromium worked
    assert set(render_leftovers()) == before


def test_resvg_renders_fitted_and_centred():
    result = render_png(WIDE, renderer="resvg", size=(256, 256))
    assert result.error is None and result.renderer == "resvg"
    assert_wide_square(result.png)


def test_default_size_square_with_resvg():
    square = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 4 4"><rect x="1" y="1" width="2" height="2" fill="red"/></svg>'
    result = render_png(square, renderer="resvg", size=RenderSettings().size)
    assert decode_png(result.png)[:2] == (512, 512)
    assert pixel(result.png, 256, 256) == (255, 0, 0) and pixel(result.png, 50, 50) == (255, 255, 255)


def test_resvg_draws_text():
    assert "font_family" in resvg_fonts(), "no installed font found for resvg: apt-get install fonts-dejavu-core"
    result = render_png(TEXT_ONLY, renderer="resvg", size=(128, 128))
    assert result.error is None
    assert not checks.is_blank(result.png)


def test_resvg_refuses_external_references():
    svg = '<svg xmlns="http://www.w3.org/2000/svg"><image href="file:///etc/hostname" width="9" height="9"/><rect width="9" height="9"/></svg>'
    result = render_png(svg, renderer="resvg", size=(64, 64))
    assert result.png == b"" and "external references" in result.error


async def test_chromium_timeout_kills_and_cleans_up():
    before = set(render_leftovers())
    result = await render_png_async(WIDE, renderer="chromium", size=(64, 64), timeout_s=0.05)
    assert result.png == b"" and "did not finish" in result.error
    assert set(render_leftovers()) == before


def test_missing_chromium_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HARNESS_ENV_CHROMIUM", "/nonexistent/chromium")
    with pytest.raises(RendererMissingError) as e:
        render_png(WIDE, renderer="chromium", size=(64, 64))
    msg = str(e.value)
    assert "apt-get install chromium" in msg and "resvg" in msg and "/nonexistent/chromium" in msg
    assert e.value.kind == "verify"  # an infrastructure failure: reward None, not 0


def test_unknown_renderer():
    with pytest.raises(ValueError):
        render_png(WIDE, renderer="inkscape", size=(64, 64))  # type: ignore[arg-type]


async def test_zero_reasons():
    settings = RenderSettings(width=128, height=128, renderer="resvg")
    reasons, result = await zero_reasons(WIDE, settings)
    assert reasons == [] and result is not None and result.png
    reasons, result = await zero_reasons("<svg", settings)
    assert [checks.reason_code(r) for r in reasons] == ["not_xml"] and result is None
    empty = '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"><rect width="10" height="10" fill="none"/></svg>'
    reasons, result = await zero_reasons(empty, settings)
    assert [checks.reason_code(r) for r in reasons] == ["blank"]
    reasons, _ = await zero_reasons(None, settings)
    assert [checks.reason_code(r) for r in reasons] == ["missing"]
    ext = '<svg xmlns="http://www.w3.org/2000/svg"><image href="/etc/x.png" width="9" height="9"/></svg>'
    reasons, _ = await zero_reasons(ext, settings)
    assert [checks.reason_code(r) for r in reasons] == ["unrenderable"]


async def test_chromium_renders_are_limited_per_process(monkeypatch):
    import asyncio

    from harness_env.families.svg_icon import render as render_mod

    monkeypatch.setenv("HARNESS_ENV_RENDER_CONCURRENCY", "1")
    running, peak = 0, 0

    async def fake_render(*_args):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return b"", "fake"

    monkeypatch.setattr(render_mod, "_render_chromium_now", fake_render)
    await asyncio.gather(*(render_mod._render_chromium("<svg/>", 8, 8, "#fff", 5) for _ in range(4)))
    assert peak == 1
