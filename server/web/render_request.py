"""A stored rollout's request as its page shows it: the task, the harness, the endpoint (never its
key) and the options that differ from their defaults. Everything in it is escaped: the instruction,
commands and files are whoever sent them."""

from __future__ import annotations

import json
from html import escape
from typing import Any

from harness_env.models import RolloutRequest
from harness_env.server.web.render_text import clip

MAX_REQUEST_TEXT = 4_000  # per instruction or command list shown


def changed_options(request: dict[str, Any]) -> dict[str, Any]:
    """The request's options that differ from their defaults (the task and endpoint apart)."""
    out = {}
    for name, info in RolloutRequest.model_fields.items():
        if name in ("task", "endpoint", "harness") or name not in request:
            continue
        default = info.get_default(call_default_factory=True)
        if request[name] != (default.model_dump(mode="json") if hasattr(default, "model_dump") else default):
            out[name] = request[name]
    return out


def request_html(request: dict[str, Any] | None) -> str:
    """The request, collapsed under a one-line summary."""
    if not request:
        return ""
    task, endpoint = request.get("task") or {}, request.get("endpoint") or {}
    rows = [
        ("task id", task.get("task_id") or "-"),
        ("harness", request.get("harness") or "-"),
        ("endpoint", f"{endpoint.get('base_url', '-')} · model {endpoint.get('model', '-')} (its key is never stored)"),
        ("instruction", clip(task.get("instruction") or "", MAX_REQUEST_TEXT)),
        ("setup", clip("\n".join(task.get("setup") or []), MAX_REQUEST_TEXT) or "-"),
        ("verify", clip("\n".join(task.get("verify") or []), MAX_REQUEST_TEXT) or "-"),
        ("files", ", ".join(task.get("files") or {}) or "-"),
        ("options (not the defaults)", json.dumps(changed_options(request), indent=1) if changed_options(request) else "all defaults"),
    ]
    body = "".join(f'<tr data-field="{escape(k)}"><th>{escape(k)}</th><td><pre>{escape(v)}</pre></td></tr>' for k, v in rows)
    return (
        f'<details class="he-request"><summary>request: task {escape(task.get("task_id") or "-")} · {escape(request.get("harness") or "-")} · '
        f'model {escape(endpoint.get("model", "-"))}</summary><table class="he-table"><tbody>{body}</tbody></table></details>'
    )
