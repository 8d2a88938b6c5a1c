"""The policy server: an ASGI app (a ChatCompletionsApp) on a loopback port, from a background thread."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


class PolicyServer:
    """Serves an ASGI app (a ChatCompletionsApp) on a loopback port from a background thread.

    `with PolicyServer(app) as srv:` -> `srv.base_url` (ends in /v1), `srv.port`."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, join_timeout_s: float = 30) -> None:
        import uvicorn

        self.app = app
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}/v1"
        self._join_timeout_s = join_timeout_s  # a generation in progress finishes first
        asgi = app.app() if hasattr(app, "app") else app
        self._server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning", lifespan="off", access_log=False))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True, name="policy-server")

    def __enter__(self) -> PolicyServer:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            raise RuntimeError("the policy server did not start within 10 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._server.force_exit = True
        self._thread.join(timeout=self._join_timeout_s)
        self._sock.close()
