"""`PlainLines`: a made-up wire API, registered from outside the package, that differs from chat
completions everywhere a real one can: its route (templated, with the model in the path), where the
key goes, the request shape, the answer shape, the stream format (NDJSON lines translated from the
engine's SSE chunk by chunk) and the error shape. The proxy still assembles the turn from the
engine's own token ids. tests/core/capture/test_dialects.py drives it through a proxy;
tests/test_plugins_from_outside.py runs a rollout whose harness speaks it.
"""

import json

from harness_env.core.capture import fastjson
from harness_env.core.capture.asgi import Reply, Scope, header, json_reply
from harness_env.core.capture.dialects import ChatRequest, RequestShape, Route
from harness_env.core.capture.sse import SSEDecoder
from harness_env.core.errors import InvalidRequestError

SHELL_SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}


def _final(draft, error=None) -> dict:
    calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in draft.fields()["tool_calls"]]
    return {"text": "".join(draft.text_parts), "calls": calls, "finish": draft.finish_reason, "error": error}


class PlainStream:
    """Each engine chunk's new text becomes a {"delta": ...} line as it arrives; a last line sums up."""

    content_type = "application/x-ndjson"

    def __init__(self, draft):
        self.draft, self.decoder, self.sent_parts = draft, SSEDecoder(), 0

    def _lines(self, events) -> bytes:
        for event in events:
            self.draft.add_chunk_text(event)
        new = "".join(self.draft.text_parts[self.sent_parts :])
        self.sent_parts = len(self.draft.text_parts)
        return json.dumps({"delta": new}).encode() + b"\n" if new else b""

    def feed(self, data: bytes) -> bytes:
        return self._lines(self.decoder.feed(data))

    def close(self, error):
        return self._lines(self.decoder.flush()) + json.dumps({"done": True, **_final(self.draft, error)}).encode() + b"\n"

    def finish(self):
        pass  # assembled as it went


class PlainLines:
    name = "plain_lines"
    request_shape = RequestShape()  # its reader checks what it reads
    native = None  # no upstream speaks it: never passed through
    routes = (Route("POST", "/plain/{model}:complete"), Route("GET", "/plain/ping", model_call=False))

    def presented_key(self, scope: Scope):
        return header(scope, b"x-plain-key")

    def read_request(self, body, scope: Scope, sampled=None) -> ChatRequest:
        if not isinstance(body.get("prompt"), str):
            raise InvalidRequestError("'prompt' must be a string")
        tools = [{"type": "function", "function": {"name": n, "parameters": SHELL_SCHEMA}} for n in body.get("tools", [])]
        messages = [{"role": "user", "content": body["prompt"]}]
        # What went before, as a list of {"said": the agent's text, "heard": what it got back}.
        for earlier in body.get("earlier", []):
            if not (isinstance(earlier, dict) and isinstance(earlier.get("said"), str) and isinstance(earlier.get("heard"), str)):
                raise InvalidRequestError('each of \'earlier\' must be {"said": string, "heard": string}')
            messages += [{"role": "assistant", "content": earlier["said"]}, {"role": "user", "content": earlier["heard"]}]
        return ChatRequest(messages, tools, bool(body.get("stream")), "policy" if tools else "auxiliary", body)

    def engine_body(self, request: ChatRequest) -> dict:
        return {"messages": request.messages, "tools": request.tools, "stream": request.stream}

    def answer(self, request, engine_body: bytes, content_type: str, draft):
        draft.add_response_body(engine_body)
        return fastjson.dumps(_final(draft)), "application/json"

    def stream(self, request, draft):
        return PlainStream(draft)

    def error(self, status: int, message: str, code: str) -> Reply:
        return json_reply(status, {"problem": message, "code": code})

    def upstream_error(self, status: int, engine_body: bytes, content_type: str) -> Reply:
        return self.error(status, engine_body.decode(errors="replace"), "upstream")

    def local_reply(self, route, session, scope) -> Reply:
        return json_reply(200, {"pong": session.endpoint.model})
