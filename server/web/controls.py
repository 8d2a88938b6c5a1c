"""The Gradio controls of the web form's option Controls (server/web/form.py holds the pure part)."""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from harness_env.server.web.form import Control


def component(c: Control, prefix: str = "") -> gr.components.Component:
    """The Gradio control of a form Control: its label, its description as info, its default."""
    common = {"label": c.label, "info": c.info or None, "elem_id": c.elem_id(prefix)}
    if c.kind == "checkbox":
        return gr.Checkbox(value=bool(c.default), **common)
    if c.kind == "radio":
        return gr.Radio(list(c.choices), value=c.default, **common)
    if c.kind == "dropdown":
        return gr.Dropdown(choices=list(c.choices), value=c.default if c.choices else None, **common)
    if c.kind == "number":
        return gr.Number(value=c.default, precision=0 if c.integer else None, minimum=c.minimum, maximum=c.maximum, **common)
    if c.kind == "json":
        value = "" if not c.default else json.dumps(c.default)
        return gr.Textbox(value=value, placeholder=c.placeholder or "{} (a JSON object)", lines=8 if c.placeholder else 1, max_lines=24, **common)
    return gr.Textbox(value=c.default or "", placeholder="(none)" if c.default is None else "", **common)


def shown_value(value: Any) -> Any:
    """A family option's value as its control shows it: an object as JSON text, none as empty."""
    if isinstance(value, dict):
        return json.dumps(value, indent=1)
    return "" if value is None else value
