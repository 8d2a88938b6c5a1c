"""Rendering a submitted SVG icon to a PNG of fixed size, for grading.

Two renderers, always chosen explicitly (a missing Chromium is an error, never a silent switch):
- `chromium`: headless Chromium screenshots a page that shows the SVG through `<img>` (no script,
  no external resources; see chromium.WRAPPER_HTML), scaled to fit and centred on white. The same
  command line the sandbox's preview helper runs, so what the agent previews is what is graded.
- `resvg`: resvg-py in-process (milliseconds, no browser), for machines without Chromium. System
  fonts are loaded and the generic families point at fonts that exist here, so `<text>` is drawn
  rather than silently dropped. Its output is fitted and centred the same way.

Chromium runs as a subprocess under asyncio (the server's loop is never blocked), in its own
process group, killed as a whole on timeout; its temporary profile and page are always removed.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Literal

from harness_env.core.cpus import available_cpus
from harness_env.core.errors import HarnessEnvError
from harness_env.core.limits import ProcessLimiter
from harness_env.core.procs import kill_process_group
from harness_env.families.svg_icon import checks, chromium, pngcodec
from harness_env.families.svg_icon.checks import DEFAULT_MAX_BYTES, DEFAULT_SIZE
from harness_env.families.svg_icon.pngcodec import decode_png

Renderer = Literal["chromium", "resvg"]
RENDERERS: tuple[Renderer, ...] = ("chromium", "resvg")
DEFAULT_TIMEOUT_S = 30.0

__all__ = [
    "RENDERERS",
    "RenderResult",
    "RenderSettings",
    "Renderer",
    "RendererMissingError",
    "chromium_path",
    "decode_png",
    "render_png",
    "render_png_async",
    "resvg_fonts",
    "zero_reasons",
]


class RendererMissingError(HarnessEnvError):
    """The chosen renderer cannot run on this machine: an infrastructure failure of grading (the
    reward is None, not 0), never a reason to switch renderer quietly."""

    kind = "verify"


@dataclass(frozen=True)
class RenderSettings:
    width: int = DEFAULT_SIZE[0]
    height: int = DEFAULT_SIZE[1]
    background: str = "#ffffff"
    renderer: Renderer = "chromium"
    timeout_s: float = DEFAULT_TIMEOUT_S
    max_bytes: int = DEFAULT_MAX_BYTES  # larger submissions are "oversized" and never rendered

    @property
    def size(self) -> tuple[int, int]:
        return (self.width, self.height)


@dataclass(frozen=True)
class RenderResult:
    png: bytes  # empty when error is set
    width: int
    height: int
    renderer: Renderer
    seconds: float
    error: str | None = None  # why this SVG could not be rendered (a property of the submission)


def chromium_path() -> str:
    """The Chromium to grade with: HARNESS_ENV_CHROMIUM, else /usr/bin/chromium, else on PATH."""
    found = chromium.find_chromium()
    if found is None:
        explicit = os.environ.get(chromium.CHROMIUM_ENV)
        where = f"{chromium.CHROMIUM_ENV}={explicit!r} is not an executable file" if explicit else "no Chromium found"
        raise RendererMissingError(f"renderer 'chromium': {where}; {chromium.CHROMIUM_INSTALL_HINT}")
    return found


# -- resvg ------------------------------------------------------------------------------------


def _fc_match(pattern: str) -> str | None:
    fc = shutil.which("fc-match")
    if fc is None:
        return None
    try:
        out = subprocess.run([fc, "-f", "%{family[0]}", pattern], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    family = out.stdout.strip()
    return family if out.returncode == 0 and family else None


_DEJAVU = {
    "sans-serif": ("DejaVu Sans", "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"),
    "serif": ("DejaVu Serif", "/usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf"),
    "monospace": ("DejaVu Sans Mono", "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"),
}


@functools.cache
def resvg_fonts() -> dict[str, str]:
    """resvg-py keyword arguments naming installed families for the generic ones (resvg's own
    defaults, e.g. Times New Roman, are often absent: text would then vanish). Found with
    fc-match, else the DejaVu fonts when their files exist; empty if neither."""
    out: dict[str, str] = {}
    for generic, key in (("sans-serif", "sans_serif_family"), ("serif", "serif_family"), ("monospace", "monospace_family")):
        family = _fc_match(generic)
        if family is None and os.path.exists(_DEJAVU[generic][1]):
            family = _DEJAVU[generic][0]
        if family:
            out[key] = family
    if "sans_serif_family" in out:
        out["font_family"] = out["sans_serif_family"]  # text with no font-family at all
    return out


def _render_resvg(svg_text: str, width: int, height: int, background: str) -> bytes:
    import resvg_py

    refs = checks.external_refs(svg_text)
    if refs:
        # Chromium never loads these inside <img>; resvg would read local files. Refuse.
        raise ValueError(f"external references are not rendered (embed them as data: URIs): {refs[:3]}")
    png = resvg_py.svg_to_bytes(svg_string=svg_text, width=width, height=height, background=background, skip_system_fonts=False, **resvg_fonts())
    # resvg fits the image inside width x height keeping its aspect ratio; centre it on the page
    # like Chromium's object-fit: contain.
    return pngcodec.paste_centered(width, height, bytes(png), _rgb(background))


def _rgb(colour: str) -> tuple[int, int, int]:
    """'#rrggbb' as a tuple; any other spelling is taken as white (the default page)."""
    h = colour.lstrip("#")
    if len(h) == 6:
        try:
            return (int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16))
        except ValueError:
            pass
    return (255, 255, 255)


# -- Chromium ---------------------------------------------------------------------------------


def render_concurrency() -> int:
    """Browsers this process runs at once for grading (HARNESS_ENV_RENDER_CONCURRENCY, default the
    CPUs this process may use): hundreds of rollouts finishing together must not start hundreds of Chromiums."""
    value = os.environ.get("HARNESS_ENV_RENDER_CONCURRENCY", "")
    return int(value) if value.isdigit() and int(value) > 0 else available_cpus()


async def _render_chromium(svg_text: str, width: int, height: int, background: str, timeout_s: float) -> tuple[bytes, str | None]:
    async with ProcessLimiter.named("chromium-render", render_concurrency()):
        return await _render_chromium_now(svg_text, width, height, background, timeout_s)


async def _render_chromium_now(svg_text: str, width: int, height: int, background: str, timeout_s: float) -> tuple[bytes, str | None]:
    browser = chromium_path()
    tmp = await asyncio.to_thread(tempfile.mkdtemp, prefix="harness-env-render-", dir=chromium.chromium_tmp_root())
    try:
        argv, out = await asyncio.to_thread(chromium.prepare_screenshot, browser, tmp, svg_text.encode("utf-8"), width, height, background)
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "FONTCONFIG_FILE", "FONTCONFIG_PATH")}
        env.update(HOME=tmp, TMPDIR=tmp, XDG_CONFIG_HOME=tmp, XDG_CACHE_HOME=tmp)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env, cwd=tmp, start_new_session=True
        )
        try:
            _, stderr = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            return b"", f"Chromium did not finish within {timeout_s:g}s"
        finally:
            kill_process_group(proc.pid)  # helpers (GPU, renderer, zygote) left behind, or all on timeout
            if proc.returncode is None:
                await proc.wait()
        return await asyncio.to_thread(chromium.read_screenshot, out, proc.returncode, stderr)
    finally:
        await asyncio.to_thread(shutil.rmtree, tmp, True)


# -- public -----------------------------------------------------------------------------------


async def render_png_async(
    svg_text: str, *, renderer: Renderer, size: tuple[int, int] = DEFAULT_SIZE, background: str = "#ffffff", timeout_s: float = DEFAULT_TIMEOUT_S
) -> RenderResult:
    """Render `svg_text` to a `size` PNG on `background`, fitted and centred. A submission that
    cannot be rendered gives `error`; a renderer that cannot run raises RendererMissingError."""
    if renderer not in RENDERERS:
        raise ValueError(f"renderer must be one of {RENDERERS}, got {renderer!r}")
    width, height = size
    started = time.monotonic()
    error: str | None
    if renderer == "chromium":
        png, error = await _render_chromium(svg_text, width, height, background, timeout_s)
    else:
        try:
            import resvg_py  # noqa: F401
        except ImportError as e:
            raise RendererMissingError("renderer 'resvg' needs resvg-py: install the server extra (uv sync --extra server)") from e
        try:
            png, error = await asyncio.to_thread(_render_resvg, svg_text, width, height, background), None
        except (ValueError, pngcodec.PngError) as e:
            png, error = b"", f"resvg: {e}"
    return RenderResult(png, width, height, renderer, time.monotonic() - started, error)


def render_png(svg_text: str, **options: Any) -> RenderResult:
    """Blocking form of render_png_async (the same keyword arguments), for scripts and threads
    (not inside a running loop)."""
    return asyncio.run(render_png_async(svg_text, **options))


async def zero_reasons(svg_text: str | bytes | None, settings: RenderSettings = RenderSettings()) -> tuple[list[str], RenderResult | None]:
    """Everything before the judge: inspect the source, render it, check the page. An empty list
    means the icon goes to the judge with `result.png`; otherwise its reward is 0 for these
    reasons (the render is None when the source was refused before rendering)."""
    reasons = checks.inspect_svg(svg_text, settings.max_bytes)
    if reasons:
        return reasons, None
    assert svg_text is not None
    text = svg_text.decode("utf-8", "replace") if isinstance(svg_text, bytes) else svg_text
    result = await render_png_async(text, renderer=settings.renderer, size=settings.size, background=settings.background, timeout_s=settings.timeout_s)
    if result.error is not None:
        return [checks.reason(checks.UNRENDERABLE, result.error)], result
    return checks.page_reasons(result.png, settings.width, settings.height), result
