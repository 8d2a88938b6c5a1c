"""server/app.py's front door: /capture/... goes straight to the capture proxy (it authenticates
by capture key and bounds its own bodies), with the route below /capture intact; everything else
goes to the API with its token, origin and body checks."""

from harness_env.core.capture.asgi import route_path
from harness_env.server.app import capture_first


async def test_capture_calls_go_straight_to_the_proxy_with_their_route_below_capture():
    seen: list[tuple[str, str]] = []

    async def proxy(scope, receive, send):
        seen.append(("proxy", route_path(scope)))

    async def api(scope, receive, send):
        seen.append(("api", scope["path"]))

    front = capture_first(proxy, api)
    scopes = [
        {"type": "http", "path": "/capture/v1/chat/completions", "root_path": ""},
        {"type": "http", "path": "/space/capture/v1/models", "root_path": "/space"},  # a path that includes the root path
        {"type": "http", "path": "/capture/v1/models", "root_path": "/space"},  # one that does not (older servers)
        {"type": "http", "path": "/capture", "root_path": ""},  # nothing below /capture: the API's 404
        {"type": "http", "path": "/capturex/v1", "root_path": ""},
        {"type": "http", "path": "/rollout", "root_path": ""},
        {"type": "websocket", "path": "/capture/v1/x", "root_path": ""},
    ]
    for scope in scopes:
        await front(scope, None, None)
    assert seen == [("proxy", "/v1/chat/completions"), ("proxy", "/v1/models"), ("proxy", "/v1/models"),
                    ("api", "/capture"), ("api", "/capturex/v1"), ("api", "/rollout"), ("api", "/capture/v1/x")]
