"""The agent's preview helper for the SVG icon family, and how the family ships it.

Inside the sandbox the agent runs `python3 .harness/preview.py [icon.svg]`: the icon is checked
exactly as grading checks it (checks.py), rendered with the sandbox's Chromium to
`icon.preview.png` by the same page and command line the server uses (chromium.py), and described in text (file size,
parse errors, rendered size, blank or not, bounding box of drawn content, dominant colours), so the
agent can refine it without seeing pixels.

This file is both a module of the package (for `preview_files()` and tests) and the helper
itself: `preview_files()` ships this file's SOURCE and its libraries' (checks.py, pngcodec.py,
chromium.py) verbatim, so there is one implementation of every check. Hence standard library only,
Python >= 3.11 (the sandbox runs the system `python3`, without a venv), and nothing from
harness_env imported: not even core/procs.py's process-group killer, which this file repeats in
three lines.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__:
    from . import checks, chromium, pngcodec
else:  # run as a script in the sandbox: its libraries sit next to this file
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import checks  # type: ignore[no-redef]
    import chromium  # type: ignore[no-redef]
    import pngcodec  # type: ignore[no-redef]

HELPER_DIR = ".harness"  # relative to the workspace
PREVIEW_SCRIPT = f"{HELPER_DIR}/preview.py"
PREVIEW_COMMAND = f"python3 {PREVIEW_SCRIPT}"
PREVIEW_OUTPUT = "icon.preview.png"
DEFAULT_TIMEOUT_S = 60.0
LIBRARIES = ("checks.py", "pngcodec.py", "chromium.py")  # shipped beside the helper


def preview_files() -> dict[str, str]:
    """Files to write into the task's workspace (path relative to it -> content) so that
    PREVIEW_COMMAND works there."""
    here = Path(__file__).resolve().parent
    return {
        PREVIEW_SCRIPT: (here / "preview.py").read_text(encoding="utf-8"),
        **{f"{HELPER_DIR}/{name}": (here / name).read_text(encoding="utf-8") for name in LIBRARIES},
    }


def preview_instructions() -> str:
    """One paragraph for the task prompt."""
    return (
        f"To check your icon, run `{PREVIEW_COMMAND}` in the workspace: it renders icon.svg the way "
        f"grading does to {PREVIEW_OUTPUT} and reports parse errors, blankness, the bounding box of "
        "what is drawn and its main colours."
    )


# -- the helper -------------------------------------------------------------------------------


def render_with_chromium(svg: bytes, width: int, height: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[bytes, str | None]:
    """(png, error): the sandbox-side twin of render.py's Chromium path (same page, same argv),
    blocking; the whole process group is killed on timeout and the temp dir removed."""
    browser = chromium.find_chromium()
    if browser is None:
        return b"", f"Chromium is not available here: {chromium.CHROMIUM_INSTALL_HINT}"
    tmp = tempfile.mkdtemp(prefix="icon-preview-", dir=chromium.chromium_tmp_root())
    try:
        argv, out = chromium.prepare_screenshot(browser, tmp, svg, width, height)
        env = dict(os.environ)
        env.setdefault("HOME", tmp)
        env["TMPDIR"] = tmp  # Chromium's singleton socket goes here: a short path (see chromium_tmp_root)
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp, start_new_session=True)
        try:
            _, stderr = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            proc.communicate()
            return b"", f"Chromium did not finish within {timeout_s:g}s"
        _killpg(proc.pid)
        return chromium.read_screenshot(out, proc.returncode, stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _shown(path: str) -> str:
    """`path` relative to the current directory when it is inside it."""
    rel = os.path.relpath(os.path.abspath(path))
    return path if rel.startswith("..") else rel


def _killpg(pid: int) -> None:
    """core/procs.kill_process_group, repeated: this script cannot import the package."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def report(path: str, out_png: str, width: int, height: int, max_bytes: int, timeout_s: float) -> tuple[int, list[str]]:
    """(exit code, report lines). 0: the icon would go to the judge; 1: it would score 0;
    2: the preview itself could not run (no Chromium)."""
    lines: list[str] = []
    try:
        data: bytes | None = Path(path).read_bytes()
    except FileNotFoundError:
        data = None
    except OSError as e:
        return 1, [f"{path}: cannot read it: {e}"]
    lines.append(f"file: {_shown(path)}, " + ("missing" if data is None else f"{len(data)} bytes (limit {max_bytes})"))
    reasons = checks.inspect_svg(data, max_bytes)
    if reasons:
        lines += [f"problem: {r}" for r in reasons]
        lines.append("verdict: this icon would score 0 (fix the problems above)")
        return 1, lines
    assert data is not None
    lines.append("parse: ok, an <svg> document")
    refs = checks.external_refs(data)
    if refs:
        lines.append(f"note: external references are never loaded (embed as data: URIs): {', '.join(refs[:3])}")
    started = time.monotonic()
    png, error = render_with_chromium(data, width, height, timeout_s)
    seconds = time.monotonic() - started
    if error is not None and not png:
        lines.append(f"render: failed: {error}")
        if chromium.find_chromium() is None:
            return 2, lines
        lines.append(f"verdict: this icon would score 0 ({checks.UNRENDERABLE})")
        return 1, lines
    with open(out_png, "wb") as f:
        f.write(png)
    problems = checks.page_reasons(png, width, height)
    try:
        stats = checks.image_stats(png)
    except pngcodec.PngError:
        stats = None
    lines.append(f"render: {width}x{height} with Chromium in {seconds:.1f}s -> {_shown(out_png)}")
    if stats is not None:
        lines.append(
            f"blank: {'yes' if stats.drawn_fraction < checks.BLANK_FRACTION else 'no'} "
            f"({stats.drawn_fraction:.1%} of the pixels differ from the background {stats.background})"
        )
        if stats.bbox is not None:
            x0, y0, x1, y1 = stats.bbox
            lines.append(f"drawn area: x {x0}..{x1}, y {y0}..{y1} ({x1 - x0}x{y1 - y0} of {stats.width}x{stats.height})")
        if stats.colours:
            lines.append("main colours: " + ", ".join(f"{c} {frac:.1%}" for c, frac in stats.colours))
    if problems:
        lines += [f"problem: {r}" for r in problems]
        lines.append("verdict: this icon would score 0 (fix the problems above)")
        return 1, lines
    lines.append("verdict: ok, this icon would be judged")
    return 0, lines


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    workspace = os.path.dirname(here) if os.path.basename(here) == HELPER_DIR else os.getcwd()
    parser = argparse.ArgumentParser(prog=PREVIEW_COMMAND, description="Render and check an SVG icon as grading does.")
    parser.add_argument("svg", nargs="?", default=os.path.join(workspace, "icon.svg"), help="default: icon.svg in the workspace")
    parser.add_argument("-o", "--output", default=None, help=f"PNG to write (default: {PREVIEW_OUTPUT} beside the SVG)")
    parser.add_argument("--size", type=int, default=checks.DEFAULT_SIZE[0], help="render width and height in pixels")
    parser.add_argument("--max-bytes", type=int, default=checks.DEFAULT_MAX_BYTES, help=argparse.SUPPRESS)
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    out = args.output or os.path.join(os.path.dirname(os.path.abspath(args.svg)), PREVIEW_OUTPUT)
    code, lines = report(args.svg, out, args.size, args.size, args.max_bytes, args.timeout)
    print("\n".join(lines))
    return code


if __name__ == "__main__":
    sys.exit(main())
