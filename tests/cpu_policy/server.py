"""The policy server: an ASGI app (a ChatCompletionsApp) on a loopback port, from a background thread."""

from __future__ import annotations

from typing import Any

from tests.fakes.loopback import LoopbackServer


class PolicyServer(LoopbackServer):
    """Serves an ASGI app (a ChatCompletionsApp) on a loopback port from a background thread.

    `with PolicyServer(app) as srv:` -> `srv.base_url` (ends in /v1), `srv.port`."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, join_timeout_s: float = 30) -> None:
        self.app = app
        # join_timeout_s: a generation in progress finishes first
        super().__init__(app.app() if hasattr(app, "app") else app, join_timeout_s=join_timeout_s, host=host, port=port)
