"""The bound on request bodies: a body over 32 MB answers 413, counted as it arrives, so a chunked
body is cut off too (the capture proxy bounds its own)."""

from __future__ import annotations

from harness_env.core.capture.asgi import Receive, Scope, Send, error_reply, header, send_reply

MAX_BODY_BYTES = 32 * 1024 * 1024


def _too_large(limit: int):
    reply = error_reply(413, f"request body over {limit} bytes; send less (files and commands have their own limits)", "request_too_large")
    # The rest of the body is not read: the connection closes after this answer.
    reply.headers.append((b"connection", b"close"))
    return reply


def limit_body(app, limit: int = MAX_BODY_BYTES, larger: dict[str, int] | None = None):
    """Refuse request bodies over `limit` bytes (/capture never gets here: capture_first hands it to
    the proxy, which bounds its own): a declared content-length at once, a chunked body as soon as it passes the limit. Then
    the client gets 413, the app sees a disconnect, and nothing it answers after is sent. `larger`: the
    exact paths that take more, with their own limit (the web UI's file upload)."""
    larger = larger or {}

    async def limited(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        limit_here = larger.get(scope.get("path", ""), limit)
        await bounded(scope, receive, send, limit_here)

    async def bounded(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        declared = header(scope, b"content-length") or ""
        if declared.isdigit() and int(declared) > limit:
            await send_reply(send, _too_large(limit))
            return
        received, refused, started = 0, False, False

        async def counted() -> dict:
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    refused = True
                    if not started:
                        await send_reply(send, _too_large(limit))
                    return {"type": "http.disconnect"}
            return message

        async def guarded(message: dict) -> None:
            nonlocal started
            if refused:
                return  # the client has its 413
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await app(scope, counted, guarded)
        except Exception:
            if not refused:
                raise  # only a failure on the body cut short is expected here, and answered

    return limited
