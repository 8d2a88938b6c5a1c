"""The engine's exact tool-call arguments, kept for dialects that hand them over as objects.

The engine writes a tool call's arguments as a JSON string; Anthropic Messages (`input`) and Gemini
(`args`) hand the harness an object, and the harness sends that object back in its history. Written
again with json.dumps it is the same object in other bytes (`{"command":"ls"}` comes back as
`{"command": "ls"}`, `1e5` as `100000.0`, `é` escaped or not), so the next prompt no longer extends
what the engine sampled and the turn graph splits into one branch per call. So each session
remembers, per call id, the text its harness was handed an object of, and a replayed call whose
object is still the same JSON value gets that text back; one the harness changed is written fresh.

Dialects that hand the harness the engine's text itself (Chat Completions, Responses) get it back
the same way: a harness may parse it and write it again (Pi writes it compact), so the proxy keeps
every answered call's text (`wrote`) and a replayed call of the same value gets it back
(`restore_history`). A bounded number and size of texts is kept per session, the least recently
replayed dropped first: a hostile policy can make any number of calls, and a dropped text costs
only a branch, never a wrong prompt.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from harness_env.core.capture.dialects.chunks import arguments_text, json_object

MAX_CALLS = 1024  # texts kept per session
MAX_CHARS = 4 * 1024 * 1024  # and their characters together (a longer text is never kept)


def handed_object(text: str) -> dict[str, Any]:
    """What a harness is handed for the engine's arguments text: its object, {} if it is none
    (arguments cut off by the token limit, or not an object)."""
    return json_object(text) or {}


def same_json(a: Any, b: Any) -> bool:
    """Whether two parsed JSON values are the same value: numbers by value (1.0 is 1, as a
    JavaScript harness reads it), objects whatever their keys' order, but true is not 1."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(v, b[k]) for k, v in a.items())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


class SampledArguments:
    """One session's call id -> the engine's arguments text for that call."""

    def __init__(self, max_calls: int = MAX_CALLS, max_chars: int = MAX_CHARS) -> None:
        self.max_calls, self.max_chars = max_calls, max_chars
        self._texts: OrderedDict[str, str] = OrderedDict()  # least recently handed or replayed first
        self.chars = 0

    def __len__(self) -> int:
        return len(self._texts)

    def handed(self, call_id: str, text: str) -> dict[str, Any]:
        """The object to hand the harness for the engine's `text`, the text remembered under
        `call_id` if json.dumps would write that object otherwise."""
        value = handed_object(text)
        if call_id and arguments_text(value) != text:
            self._keep(call_id, text)
        return value

    def text(self, call_id: str, value: Any) -> str:
        """A replayed call's arguments text: what the engine wrote, if the harness sent back the
        object it was handed; else `value` as json.dumps writes it."""
        kept = self._texts.get(call_id) if call_id else None
        if kept is not None and same_json(handed_object(kept), value if value is not None else {}):
            self._texts.move_to_end(call_id)
            return kept
        return arguments_text(value)

    def wrote(self, call_id: str | None, text: str) -> None:
        """The engine's arguments text of a call its harness was handed as text (Chat Completions,
        Responses): kept whatever its layout, since the harness may parse it and write it again
        (Pi writes `{"command":"ls"}` back for the engine's `{"command": "ls"}`)."""
        if call_id and isinstance(text, str):
            self._keep(call_id, text)

    def restored(self, call_id: str, text: str) -> str:
        """A replayed call's arguments as the harness wrote them: the engine's own text if it is
        the same JSON value, else the harness's text untouched."""
        kept = self._texts.get(call_id)
        if kept is None or kept == text:
            return text
        mine, theirs = json_object(kept), json_object(text)
        if mine is None or theirs is None or not same_json(mine, theirs):
            return text
        self._texts.move_to_end(call_id)
        return kept

    def restore_history(self, messages: list[Any]) -> list[Any]:
        """Chat messages with each replayed tool call's arguments `restored` (new dicts where
        something changed; the harness's own are never modified)."""
        out = []
        for m in messages:
            calls = m.get("tool_calls") if isinstance(m, dict) and m.get("role") == "assistant" else None
            if isinstance(calls, list) and calls:
                new = [self._restored_call(c) for c in calls]
                if any(a is not b for a, b in zip(new, calls)):
                    m = {**m, "tool_calls": new}
            out.append(m)
        return out

    def _restored_call(self, call: Any) -> Any:
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("arguments"), str) or not isinstance(call.get("id"), str):
            return call
        text = self.restored(call["id"], fn["arguments"])
        return call if text is fn["arguments"] else {**call, "function": {**fn, "arguments": text}}

    def _keep(self, call_id: str, text: str) -> None:
        """`text` under `call_id` (a text longer than max_chars is never kept), within the bounds."""
        self._forget(call_id)
        if len(text) <= self.max_chars:
            self._texts[call_id] = text
            self.chars += len(text)
            self._bound()

    def _forget(self, call_id: str) -> None:
        old = self._texts.pop(call_id, None)
        if old is not None:
            self.chars -= len(old)

    def _bound(self) -> None:
        while self._texts and (len(self._texts) > self.max_calls or self.chars > self.max_chars):
            _, old = self._texts.popitem(last=False)
            self.chars -= len(old)
