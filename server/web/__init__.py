"""The web UI at /web: manual rollouts a person can watch (Gradio, mounted in the server's app).

- page.py: layout and handlers (rollouts go through the server's RolloutService)
- rollouts.py: the Rollouts view (the job store's rollouts, one rollout's page, result files)
- result_area.py: a result's reward, summary and tabs (the run view and the Rollouts view hold one each)
- render.py: pure functions from a RolloutResult to tables, plots, chat messages
- form.py: the option controls, derived from the option fields; form values -> the run_rollout tool's arguments
- examples.py: example tasks (data)
- login.py: the token form when the server has a token

Gradio takes about ten seconds of CPU to import, so it is loaded on the first request to /web, not
when the server starts: a training server whose UI nobody opens never pays for it, and neither do
the tests that start servers by the dozen. While it loads, a request for the page itself gets a
small page that says so and reloads itself (LOADING_PAGE), not ten seconds of blank tab.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from contextlib import AsyncExitStack
from pathlib import Path

from fastapi import FastAPI

from harness_env.core.capture.asgi import Receive, Reply, Scope, Send, error_reply, send_reply
from harness_env.core.sandbox.lease import leased_temp_dir, remove_leased, write_lease
from harness_env.server.auth import WEB_LOGIN_PATH, WEB_PREFIX, AuthFailureLimiter, is_web_path
from harness_env.server.loop_lag import freeze_long_lived
from harness_env.server.service import RolloutService
from harness_env.server.web.login import add_login_routes
from harness_env.server.web.result_file import MAX_RESULT_FILE_BYTES

UPLOAD_PATH = WEB_PREFIX + "/gradio_api/upload"  # Gradio's upload route, where the page sends a result file
# The upload's body may be a result file of the limit and its multipart framing. Gradio's own
# per-file check sits above that: it answers 413 but leaves the connection reading the rest of the
# body, where the server's body limit closes it. A file just over the limit still arrives, and
# result_file says how big it is.
UPLOAD_BODY_BYTES = MAX_RESULT_FILE_BYTES + 512 * 1024
GRADIO_MAX_FILE_BYTES = MAX_RESULT_FILE_BYTES + 1024 * 1024


_own_gradio_cache: str | None = None  # the GRADIO_TEMP_DIR this process made (Gradio reads it once)
LOADING_WAIT_S = 0.3  # how long a request for the page waits for Gradio before the loading page answers
LOADING_PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><meta http-equiv="refresh" content="1"><title>harness-env: loading</title>
<style>body { font-family: system-ui, sans-serif; margin: 4rem auto; max-width: 36rem; color: #374151; }</style></head>
<body><h2>harness-env</h2><p id="web-loading">Loading the web UI: the first visit after the server starts loads
Gradio, which takes about ten seconds. This page reloads itself when it is ready.</p></body></html>
"""


def _gradio_environment() -> str | None:
    """Set Gradio's environment before it is imported; returns the cache directory made for it
    here, for the caller to remove (None when the operator set GRADIO_TEMP_DIR). Quick: it runs
    before the slow import, so a server stopped during that import still removes the directory."""
    global _own_gradio_cache
    # Nothing of Gradio's may call out: analytics and Hub telemetry off before it is imported.
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    # Gradio copies every file it serves (the result JSONs offered for download) into its cache,
    # by default a shared /tmp/gradio it never empties: give it one that is removed at close.
    if "GRADIO_TEMP_DIR" not in os.environ:
        _own_gradio_cache = str(leased_temp_dir("gradio"))  # leased: a start after a kill removes it
        os.environ["GRADIO_TEMP_DIR"] = _own_gradio_cache
    elif os.environ["GRADIO_TEMP_DIR"] == _own_gradio_cache:  # a second UI in this process (tests)
        os.makedirs(_own_gradio_cache, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            write_lease(Path(_own_gradio_cache))
    return _own_gradio_cache if os.environ["GRADIO_TEMP_DIR"] == _own_gradio_cache else None


def _import_gradio() -> None:
    """The slow part (about ten seconds of CPU): Gradio and the page's modules."""
    import gradio  # noqa: F401

    import harness_env.server.web.page  # noqa: F401


class WebUI:
    """Adds /web to `app`: the login routes at once, the Gradio page on first use."""

    def __init__(self, app: FastAPI, service: RolloutService, token: str | None, limiter: AuthFailureLimiter | None = None) -> None:
        self.app = app
        self.service = service
        self.page = None  # the WebPage, once mounted
        self._lock = asyncio.Lock()
        self._stack = AsyncExitStack()
        self._gradio_cache: str | None = None
        self._mounting: asyncio.Task[None] | None = None  # the load a page request started
        add_login_routes(app, token, limiter)

    @staticmethod
    def body_limits() -> dict[str, int]:
        """Request bodies the page takes beyond the server's own limit, by exact path: a result file
        of up to MAX_RESULT_FILE_BYTES."""
        return {UPLOAD_PATH: UPLOAD_BODY_BYTES}

    def wrap(self, inner):
        """An ASGI app that mounts the page before the first /web request reaches `inner`."""

        async def web_on_demand(scope: Scope, receive: Receive, send: Send) -> None:
            if self.page is None and scope["type"] in ("http", "websocket") and is_web_path(scope.get("path", "")) and scope.get("path") != WEB_LOGIN_PATH:
                if (
                    scope["type"] == "http"
                    and scope.get("method") == "GET"
                    and scope.get("path") in (WEB_PREFIX, WEB_PREFIX + "/")
                    and not await self._mounted_soon()
                ):
                    await send_reply(send, Reply(200, LOADING_PAGE, "text/html; charset=utf-8", headers=[(b"cache-control", b"no-store")]))
                    return
                try:
                    await self.ensure_mounted()
                except Exception as e:  # a broken UI must not take the API down with it
                    if scope["type"] == "http":
                        await send_reply(send, error_reply(503, f"the web UI failed to load: {type(e).__name__}: {e}", "web_unavailable"))
                    return
            await inner(scope, receive, send)

        return web_on_demand

    async def _mounted_soon(self) -> bool:
        """Start loading the page (once) and wait LOADING_WAIT_S for it. A load that failed is
        forgotten: the caller's ensure_mounted tries again and answers 503 if it fails again."""
        if self._mounting is None:
            self._mounting = asyncio.create_task(self.ensure_mounted())
        task = self._mounting
        done, _ = await asyncio.wait({task}, timeout=LOADING_WAIT_S)
        if done and (task.cancelled() or task.exception() is not None) and self._mounting is task:
            self._mounting = None
        return bool(done)

    async def ensure_mounted(self) -> None:
        async with self._lock:
            if self.page is not None:
                return
            self._gradio_cache = _gradio_environment()
            await asyncio.to_thread(_import_gradio)  # the slow part, off the event loop
            import gradio as gr

            from harness_env.server.web.page import build_page
            from harness_env.server.web.style import CSS

            page = build_page(self.service)
            # run_history off: Gradio would otherwise keep every run's inputs (the API key among
            # them) in the browser's storage. No footer: its links lead to API docs and gradio.app.
            gr.mount_gradio_app(
                self.app,
                page.blocks,
                path=WEB_PREFIX,
                css=CSS,
                run_history=False,
                footer_links=[],
                ssr_mode=False,
                show_error=True,
                max_file_size=GRADIO_MAX_FILE_BYTES,
            )
            # The server's lifespan has already run: start what mount_gradio_app would have
            # started there (Gradio's own lifespan, its queue), and stop it in aclose().
            gradio_app = self.app.router.routes[-1].app
            await self._stack.enter_async_context(gradio_app.router.lifespan_context(gradio_app))
            page.blocks.run_startup_events()
            await page.blocks.run_extra_startup_events()
            self.page = page
            freeze_long_lived()  # Gradio's objects stay: out of the garbage collector's scans

    async def aclose(self) -> None:
        if self._mounting is not None and not self._mounting.done():
            self._mounting.cancel()
            await asyncio.gather(self._mounting, return_exceptions=True)
        if self.page is not None:
            self.page.close()
        await self._stack.aclose()
        if self._gradio_cache is not None:
            remove_leased(Path(self._gradio_cache))
