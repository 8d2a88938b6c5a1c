"""Headless Chromium for the SVG icon family: where it is, and the pure builders of its page and
command line, shared by the server's renderer (render.py) and the sandbox's preview helper
(preview.py), so that what the agent previews is drawn exactly as what is graded.

Standard library only, Python >= 3.11: its source is shipped into the sandbox beside the preview
helper (see preview.preview_files), which has the system `python3` and no venv. Running the
browser (async on the server, blocking in the sandbox) stays with each caller.
"""

from __future__ import annotations

import os
import shutil

CHROMIUM_ENV = "HARNESS_ENV_CHROMIUM"
CHROMIUM_INSTALL_HINT = (
    "install it with `apt-get install chromium` (the project's ./dev does), set HARNESS_ENV_CHROMIUM "
    'to its path, or choose the pure-Python renderer explicitly with renderer="resvg"'
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


def prepare_screenshot(chromium: str, directory: str, svg: bytes, width: int, height: int, background: str = "#ffffff") -> tuple[list[str], str]:
    """Write the icon and the page showing it into `directory` (a fresh temporary directory, which
    also receives the browser's profile); the command line that screenshots the page, and the path
    the screenshot goes to (read it with read_screenshot)."""
    with open(os.path.join(directory, "icon.svg"), "wb") as f:
        f.write(svg)
    page, out = os.path.join(directory, "page.html"), os.path.join(directory, "out.png")
    with open(page, "w", encoding="utf-8") as f:
        f.write(wrapper_html("icon.svg", background))
    return chromium_argv(chromium, page, out, os.path.join(directory, "profile"), width, height), out


def read_screenshot(path: str, returncode: int | None, stderr: bytes) -> tuple[bytes, str | None]:
    """The PNG a Chromium run wrote to `path`, or why there is none (its last stderr lines)."""
    try:
        with open(path, "rb") as f:
            return f.read(), None
    except OSError:
        tail = stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        return b"", f"Chromium wrote no screenshot (exit {returncode}): {' | '.join(tail)}"
