"""The wire dialects the capture proxy serves, and their routes.

Adding a dialect is one module (a class following `Dialect`: core/capture/dialects/base.py, which
declares its request's shape and, for pass-through, its own API: core/capture/dialects/native.py)
plus one `register_dialect(...)` call, here for the built-in ones; another distribution's are named
by entry points of group `harness_env.dialects` (a Dialect, its class, or a function that
registers; core/plugins.py), loaded when the registry is first read. A CaptureProxy serves the
dialects registered when it is made (or those it is given); two dialects may not claim one route.
"""

from __future__ import annotations

from collections.abc import Iterable

from harness_env.core.capture.dialects.base import ChatRequest, Dialect, RequestShape, Route, StreamTranslation, bearer_or_api_key
from harness_env.core.capture.dialects.chat import ChatCompletions
from harness_env.core.capture.dialects.gemini import Gemini
from harness_env.core.capture.dialects.messages import Messages
from harness_env.core.capture.dialects.native import NativeAnswerReader, NativeAPI
from harness_env.core.capture.dialects.responses import Responses
from harness_env.core.errors import InvalidRequestError
from harness_env.core.plugins import PluginGroup

__all__ = [
    "CHAT_COMPLETIONS",
    "ChatRequest",
    "Dialect",
    "NativeAPI",
    "NativeAnswerReader",
    "RequestShape",
    "Route",
    "RouteTable",
    "StreamTranslation",
    "bearer_or_api_key",
    "check_native_wire_api",
    "dialect_for_wire_api",
    "native_wire_apis",
    "register_dialect",
    "registered_dialects",
    "unregister_dialect",
]


class RouteTable:
    """Method and path -> (dialect, route): exact paths by one dictionary lookup (the hot path),
    templated ones in order after."""

    def __init__(self, dialects: Iterable[Dialect]) -> None:
        self.exact: dict[tuple[str, str], tuple[Dialect, Route]] = {}
        self.templated: list[tuple[Dialect, Route]] = []
        claimed: dict[tuple[str, str], Dialect] = {}
        for dialect in dialects:
            for route in dialect.routes:
                other = claimed.setdefault((route.method, route.path), dialect)
                if other is not dialect:
                    raise ValueError(f"dialects {other.name!r} and {dialect.name!r} both claim {route.method} {route.path}")
                if route.templated:
                    self.templated.append((dialect, route))
                else:
                    self.exact[(route.method, route.path)] = (dialect, route)

    def find(self, method: str, path: str) -> tuple[Dialect, Route] | None:
        found = self.exact.get((method, path))
        if found is not None:
            return found
        for dialect, route in self.templated:
            if route.method == method and route.match(path) is not None:
                return dialect, route
        return None

    def model_calls(self) -> str:
        """The model-call routes, for a 404's message."""
        calls = [r for _, r in [*self.exact.values(), *self.templated] if r.model_call]
        return ", ".join(f"{r.method} {r.path}" for r in calls)


_registry: dict[str, Dialect] = {}


def _register(obj: Dialect | type[Dialect]) -> None:
    register_dialect(obj() if isinstance(obj, type) else obj)


DIALECT_PLUGINS = PluginGroup("harness_env.dialects", _register)


def register_dialect(dialect: Dialect) -> None:
    """Serve `dialect` in every CaptureProxy made from now on."""
    if dialect.name in _registry:
        raise ValueError(f"a dialect named {dialect.name!r} is already registered")
    RouteTable([*_registry.values(), dialect])  # refuses a route claimed twice
    _registry[dialect.name] = dialect


def unregister_dialect(name: str) -> None:
    _registry.pop(name, None)


def registered_dialects() -> list[Dialect]:
    DIALECT_PLUGINS.load()
    return list(_registry.values())


def native_wire_apis() -> list[str]:
    """Every `wire_api` an endpoint may name: "chat", and each registered dialect's own API."""
    return ["chat", *(d.native.wire_api for d in registered_dialects() if d.native is not None)]


def dialect_for_wire_api(wire_api: str) -> str | None:
    """The name of the dialect an endpoint's `wire_api` speaks: "chat" is the engine's chat
    completions, another the registered dialect that declares it its own API (None: none does)."""
    if wire_api == "chat":
        return CHAT_COMPLETIONS.name
    return next((d.name for d in registered_dialects() if d.native is not None and d.native.wire_api == wire_api), None)


def check_native_wire_api(wire_api: str) -> str:
    """The dialect `wire_api` names; InvalidRequestError naming the known ones when none does."""
    name = dialect_for_wire_api(wire_api)
    if name is None:
        raise InvalidRequestError(DIALECT_PLUGINS.unknown("endpoint wire_api", wire_api, native_wire_apis()))
    return name


CHAT_COMPLETIONS = ChatCompletions()  # also the dialect of the proxy's own probe calls
register_dialect(CHAT_COMPLETIONS)
register_dialect(Responses())
register_dialect(Messages())
register_dialect(Gemini())
