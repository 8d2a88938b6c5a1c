"""The capture proxy's mount: /capture/... goes to the proxy (core/capture), where sandboxes reach
the policy, before anything of the API's."""

from __future__ import annotations

from harness_env.core.capture.asgi import Receive, Scope, Send, route_path

CAPTURE_PREFIX = "/capture"


def capture_first(proxy_app, app):
    """`app`, with /capture/... sent straight to the capture proxy: it authenticates harnesses by
    their capture key and bounds its own bodies (the API's token, origin and body checks exempt it
    anyway), and a model call should not pay the API's middleware and FastAPI's stack every turn."""
    prefix = CAPTURE_PREFIX + "/"

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            below = route_path(scope)
            if below.startswith(prefix):
                root = scope.get("root_path", "") + CAPTURE_PREFIX
                await proxy_app({**scope, "root_path": root, "path": root + below[len(CAPTURE_PREFIX) :]}, receive, send)
                return
        await app(scope, receive, send)

    return dispatch
