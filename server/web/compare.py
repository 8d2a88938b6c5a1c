"""The Compare tab: two stored rollouts side by side (render_compare.py), picked by id, or opened
from /web/?compare=A,B (the address bar follows, so a comparison can be shared)."""

from __future__ import annotations

import asyncio
from typing import Any

import gradio as gr

from harness_env.models import RolloutResult
from harness_env.server.web.render_compare import compare_html
from harness_env.server.web.render_text import md_cell
from harness_env.server.web.result_area import text_markdown

ADDRESS_JS = """() => setTimeout(() => {
  const a = document.querySelector('#cmp-share');
  if (a) history.replaceState(null, '', a.getAttribute('href'));
}, 50)"""


class CompareView:
    """Built inside the page's Blocks (in its Compare tab); `jobs`: the server's JobManager."""

    def __init__(self, jobs: Any) -> None:
        self.jobs = jobs
        gr.Markdown(
            "### Compare two rollouts\nTwo stored rollouts side by side (a pass and a fail of one task, two harnesses, two models): ids from the Rollouts tab."
        )
        with gr.Row():
            self.a = gr.Textbox(label="rollout A", placeholder="rollout id", elem_id="cmp-a")
            self.b = gr.Textbox(label="rollout B", placeholder="rollout id", elem_id="cmp-b")
            self.go = gr.Button("compare", variant="primary", size="sm", elem_id="cmp-go")
        self.note = text_markdown("cmp-note")
        self.view = gr.HTML("", elem_id="cmp-view")

    def wire(self, blocks: gr.Blocks, views: gr.Tabs) -> None:
        self.go.click(self.on_compare, inputs=[self.a, self.b], outputs=[self.note, self.view], queue=False, api_name=False)
        blocks.load(self.on_load, outputs=[views, self.a, self.b, self.note, self.view], queue=False, api_name=False)
        self.note.change(None, js=ADDRESS_JS, queue=False)

    async def on_load(self, request: gr.Request) -> list[Any]:
        """/web/?compare=A,B opens the Compare tab on those two."""
        pair = (request.query_params.get("compare") or "") if request is not None else ""
        ids = [i.strip() for i in pair.split(",")]
        if len(ids) != 2 or not all(ids):
            return [gr.update()] * 5
        return [gr.update(selected="compare-view"), *ids, *await self.on_compare(*ids)]

    async def _result(self, rollout_id: str) -> tuple[RolloutResult | None, str]:
        """The stored result of `rollout_id`, or why there is none to compare."""
        if self.jobs is None:
            return None, "this page has no job store"
        job = await self.jobs.get(rollout_id, "full") if 0 < len(rollout_id) <= 32 else None
        if job is None:
            return None, f"no rollout <code>{md_cell(rollout_id)}</code> here"
        if job.result is None:
            return None, f"rollout <code>{md_cell(rollout_id)}</code> has no result yet ({md_cell(job.status)})"
        return job.result, ""

    async def on_compare(self, a: str | None, b: str | None) -> list[Any]:
        a, b = (a or "").strip(), (b or "").strip()
        if not a or not b:
            return ["give two rollout ids", ""]
        (ra, why_a), (rb, why_b) = await self._result(a), await self._result(b)
        if ra is None or rb is None:
            return [f"**cannot compare:** {'; '.join(w for w in (why_a, why_b) if w)}", ""]
        html = await asyncio.to_thread(compare_html, ra, rb, f"A: {a}", f"B: {b}")  # long rollouts: off the loop
        link = f"?compare={a},{b}"
        return [f'**A** <code>{md_cell(a)}</code> · **B** <code>{md_cell(b)}</code> · <a id="cmp-share" href="{link}">link to this comparison</a>', html]
