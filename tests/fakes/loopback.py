"""An ASGI app served on a loopback port from a background thread: harness CLIs in their own
processes need a real port to reach a policy server."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


class LoopbackServer:
    """`with LoopbackServer(app) as srv:` -> `srv.port`, `srv.base_url` (ends in /v1)."""

    def __init__(self, app: Any, join_timeout_s: float = 10, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # TCP_NODELAY on accept
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.port = self._sock.getsockname()[1]
        self.base_url = f"http://{host}:{self.port}/v1"
        self._join_timeout_s = join_timeout_s
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True, name=type(self).__name__)

    def __enter__(self):
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        if not self._server.started:
            self.__exit__()
            raise RuntimeError(f"{type(self).__name__} did not start within 10 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._server.force_exit = True
        self._thread.join(timeout=self._join_timeout_s)
        self._sock.close()
