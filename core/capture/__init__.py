"""The capture proxy: fronts the policy endpoint, records every model call as a Turn.

proxy.py is the core (sessions, routing, the engine call, the probe); call.py one model call from
admission to its record, for the engine and for pass-through (passthrough.py: an upstream that
speaks the dialect's own API); session.py one rollout's state; record.py a call's record and the
wire Turn made from it once; dialects/ the wire APIs harnesses speak (chat completions first), each
declaring its request's shape and its own API; rewrite.py the session's policy on the engine
request; assemble.py a turn from the engine's answer; graph.py the turn graph; probe.py what an
endpoint gives a trainer; serve.py the proxy on its own socket.
"""

from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.session import CapturePolicy, CaptureSession

__all__ = ["CapturePolicy", "CaptureProxy", "CaptureSession"]
