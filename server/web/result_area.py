"""A rollout's result on the page: the reward, the summary and the tabs (verify, grading, a
harness's own, files, conversation, logprobs, JSON). The run view and the Rollouts view each hold
one, so a stored rollout or a result file looks like a fresh run."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import gradio as gr

from harness_env.core.registry import get_harness
from harness_env.families import family_names, get_family
from harness_env.models import RolloutResult
from harness_env.server.web import render

MAX_JSON_VIEW_CHARS = 300_000  # the JSON tab; the download always has everything
MAX_REFERENCE_BYTES = 8 * 1024 * 1024  # the largest reference image shown
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"  # what a PNG file starts with (the format's, not a family's)
MAX_DOWNLOADS = 32  # result JSONs kept for the download buttons


def safe_name(key: str) -> str:
    """A download's file name part: `key` is a rollout id or the page's own, but a file's
    sandbox_id is whatever the file says ("../x")."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:64].lstrip(".") or "result"


def prune_downloads(directory: Path, keep: int = MAX_DOWNLOADS) -> None:
    """Keep the newest `keep` result JSONs: each view writes one (a file opened again and again
    must not fill the disk). Gradio serves its own copy, so the page's button keeps working."""
    files = sorted(directory.glob("rollout-*.json"), key=_mtime, reverse=True)
    for old in files[keep:]:
        old.unlink(missing_ok=True)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed meanwhile by another view's prune
        return 0.0


def text_markdown(elem_id: str, value: str = "") -> gr.Markdown:
    """A Markdown component that shows data (render_text.md_text makes the data in it inert): no
    LaTeX, which would typeset $$...$$ from what the agent wrote."""
    return gr.Markdown(value, elem_id=elem_id, latex_delimiters=[])


def reference_path(task_family: Any, family_options: Any) -> str | None:
    """The reference image of a task-family rollout, as its family says (its reference_image);
    None for a shell task, or a family this server no longer has."""
    if not isinstance(task_family, str) or task_family not in family_names() or not isinstance(family_options, dict):
        return None
    return get_family(task_family).reference_image(family_options)


def reference_b64(path: str | None) -> str | None:
    """The reference PNG of a task-family rollout, base64, for the grading tab: None when the
    request had none, "" when it can no longer be read. `path` is the one the family resolved and
    checked when the rollout was accepted (reference_path); it is never sent to the page."""
    if not path:
        return None
    try:
        p = Path(path)
        if p.stat().st_size > MAX_REFERENCE_BYTES:
            return ""
        data = p.read_bytes()
    except OSError:
        return ""
    return base64.b64encode(data).decode() if data.startswith(PNG_SIGNATURE) else ""


class ResultArea:
    """The result's components, made where it is constructed (inside a Blocks); `prefix` keeps the
    elem_ids of a second area apart from the run view's."""

    def __init__(self, downloads: str, harness_names: list[str], prefix: str = "") -> None:
        self.downloads = downloads
        p = prefix
        with gr.Row():
            self.reward = gr.HTML(render.reward_html(None), elem_id=f"{p}reward")
            self.summary = text_markdown(f"{p}summary")
        with gr.Tabs() as self.tabs:
            with gr.Tab("verify", id="verify"):
                self.verify_html = gr.HTML("", elem_id=f"{p}verify-results")
            # Shown only for a result that has what they show (a task family's grading, a
            # harness's own record): a shell task run by Pi has neither.
            with gr.Tab("grading", id="grading", visible=False) as self.grading_tab:
                self.grading_html = gr.HTML("", elem_id=f"{p}grading")
            # One per harness, hidden: shown for a result its result_facts has something to say about.
            self.harnesses = {name: get_harness(name) for name in harness_names}
            self.harness_html, self.harness_tabs = {}, {}
            for name in harness_names:
                with gr.Tab(name, id=name, visible=False) as self.harness_tabs[name]:
                    self.harness_html[name] = gr.HTML("", elem_id=f"{p}{name}-info")
            with gr.Tab("files", id="files"):
                self.files_html = gr.HTML("", elem_id=f"{p}files-out")
            with gr.Tab("conversation", id="conversation"):
                # No Markdown, no LaTeX: render_turns gives each message as escaped HTML, so what the
                # model or a tool wrote shows as text (Markdown would turn ![](url) into an image).
                self.chat = gr.Chatbot(
                    value=[],
                    label="the agent's turns",
                    height=520,
                    elem_id=f"{p}conversation",
                    feedback_options=None,
                    render_markdown=False,
                    latex_delimiters=[],
                    sanitize_html=True,
                    allow_tags=False,
                )
            with gr.Tab("logprobs", id="logprobs"):
                self.logprob_plot = gr.HTML("", elem_id=f"{p}logprob-plot")
                self.logprob_md = text_markdown(f"{p}logprob-summary")
            with gr.Tab("tokens", id="tokens"):
                self.token_view = gr.HTML("", elem_id=f"{p}token-view")
            with gr.Tab("JSON", id="json"):
                self.download = gr.DownloadButton("download RolloutResult JSON", value=None, visible=False, elem_id=f"{p}download")
                self.json_code = gr.HTML("", elem_id=f"{p}result-json")  # collapsed: expanded, two model calls made a 62,000-pixel page

    @property
    def outputs(self) -> list[gr.components.Component]:
        return [
            self.reward,
            self.summary,
            self.verify_html,
            self.files_html,
            self.chat,
            self.logprob_plot,
            self.logprob_md,
            self.token_view,
            self.json_code,
            self.download,
            self.grading_html,
            *self.harness_html.values(),
            self.grading_tab,
            *self.harness_tabs.values(),
            self.tabs,
        ]

    def view(self, result: RolloutResult | None, *, cancelled: bool = False, key: str = "", reference: str | None = None) -> list[Any]:
        """The values of `outputs` for `result` (None: cleared, or "cancelled")."""
        hidden = [gr.update(visible=False)] * (1 + len(self.harness_tabs))
        if result is None:
            return [
                render.reward_html(None, cancelled=cancelled),
                "",
                "",
                "",
                [],
                "",
                "",
                "",
                "",
                gr.update(value=None, visible=False),
                "",
                *[""] * len(self.harness_html),
                *hidden,
                gr.update(selected="verify"),
            ]
        facts = {name: h.result_facts(result) for name, h in self.harnesses.items()}
        own = [name for name, f in facts.items() if f is not None]  # the harness's own tab opens
        points = render.logprob_points(result.proxy_turns)
        text = render.result_json(result)
        path = Path(self.downloads) / f"rollout-{safe_name(key or result.sandbox_id or 'result')}.json"
        path.write_text(text)
        prune_downloads(Path(self.downloads))
        return [
            render.reward_html(result),
            render.summary_markdown(result),
            render.commands_html(result.verify_results),
            render.files_html(result.files),
            render.conversation(result),
            render.logprob_svg(points),
            render.logprob_summary_markdown(points),
            render.trajectory_tokens_html(result),
            render.json_html(text, MAX_JSON_VIEW_CHARS),
            gr.update(value=str(path), visible=True),
            render.grading_html(result.grading, reference_b64(reference)),
            *(render.run_facts_html(facts[name], result.agent_trajectory) for name in self.harness_html),
            gr.update(visible=bool(result.grading)),
            *(gr.update(visible=name in own) for name in self.harness_tabs),
            gr.update(selected="grading") if result.grading else gr.update(selected=own[0]) if own else gr.update(),
        ]
