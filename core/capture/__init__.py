"""The capture proxy: fronts the policy endpoint, records every model call as a Turn.

proxy.py is the core (sessions, routing, the engine call, masking, recording); session.py one
rollout's state; dialects/ the wire APIs harnesses speak (chat completions first); rewrite.py the
session's policy on the engine request; assemble.py a turn from the engine's answer; graph.py the
turn graph; probe.py what an endpoint gives a trainer; serve.py the proxy on its own socket.
"""

from harness_env.core.capture.proxy import CaptureProxy
from harness_env.core.capture.session import CapturePolicy, CaptureSession

__all__ = ["CapturePolicy", "CaptureProxy", "CaptureSession"]
