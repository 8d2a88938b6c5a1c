"""What a dialect declares for pass-through: an upstream that speaks the dialect's own API (an
endpoint whose `wire_api` is not "chat") gets the harness's body untranslated
(core/capture/passthrough.py). The proxy does the same for every such dialect; what differs per API
is declared here, once per dialect (its `native` attribute): the endpoint's `wire_api` naming it,
the header the upstream wants its key in, the body's fields that bound an answer, and the reader
that records the native answer into the turn.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from harness_env.core.capture.assemble import TurnDraft

FieldPath = tuple[tuple[str, ...], str]  # (the object holding the field, as a key path from the body; the field)


class NativeAnswerReader(Protocol):
    """Reads one native answer into a turn draft; made per call (a stream's state lives in it)."""

    def event(self, obj: dict[str, Any], data: str) -> None:
        """One stream event, parsed (`data`: its text, for an error's message)."""
        ...

    def whole(self, obj: dict[str, Any]) -> None:
        """One whole answer (or one item of a JSON array of them)."""
        ...


@dataclass(frozen=True)
class NativeAPI:
    """A dialect's own API as an upstream speaks it (see the module docstring)."""

    wire_api: str  # the Endpoint.wire_api that names this API
    auth_header: str  # where the upstream wants its key ...
    auth_template: str  # ... and how: "{key}" or "Bearer {key}"
    max_tokens: FieldPath  # the answer's length, at most the rollout's cap (core/capture/native_guard.py)
    reader: Callable[[TurnDraft], NativeAnswerReader]
    count: FieldPath | None = None  # how many answers are asked for: always one
    count_suffix: str | None = None  # a token-counting route ends so: it generates nothing

    def counts_tokens(self, path: str) -> bool:
        """A token-counting route: its API refuses generation fields."""
        return self.count_suffix is not None and path.rstrip("/").endswith(self.count_suffix)


def add_call(draft: TurnDraft, call_id: Any, name: Any, arguments: str = "") -> dict[str, Any]:
    """A tool call of a native answer, in the next slot of the draft (chat completions' shape)."""
    call = {"id": call_id, "type": "function", "function": {"name": str(name or ""), "arguments": arguments}}
    draft.tool_calls[len(draft.tool_calls)] = call
    return call
