"""The Evals view of /web: the eval runs recorded in the job store (newest first), one run's page
(per-task mean ± standard error, pass@k as a table and a chart, error kinds with their messages,
infrastructure failures apart, its rollouts filtered), reachable as /web/?eval=ID, and two runs
compared task by task.

Everything is read from the server's store (server/store/eval_runs.py) off the event loop; the
numbers are evals/report.py's, so they are summary.json's (render_evals.py).
"""

from __future__ import annotations

import asyncio
from html import escape
from typing import Any

import gradio as gr

from harness_env.server.store import eval_runs
from harness_env.server.web import render_evals
from harness_env.server.web.result_area import text_markdown

LIST_LIMIT = 100
NOT_OPEN = "Click a run in the list, or open `/web/?eval=ID`."


class EvalsView:
    """Built inside the page's Blocks (in its Evals tab); `jobs`: the server's JobManager (None when
    the page is built without a server)."""

    def __init__(self, jobs: Any) -> None:
        self.jobs = jobs
        gr.Markdown("### Eval runs (`harness-env eval`; newest first; click one to open it)")
        with gr.Row():
            self.list_note = text_markdown("ev-list-note")
            self.refresh = gr.Button("refresh", size="sm", elem_id="ev-refresh")
        self.table = gr.Dataframe(headers=render_evals.RUN_HEADERS, value=[], interactive=False, elem_id="ev-list")
        self.ids = gr.State([])
        with gr.Accordion("compare two runs", open=True):
            with gr.Row():
                self.run_a = gr.Dropdown(label="run A", choices=[], elem_id="ev-compare-a")
                self.run_b = gr.Dropdown(label="run B", choices=[], elem_id="ev-compare-b")
                self.compare = gr.Button("compare", elem_id="ev-compare")
            self.compared = gr.HTML("", elem_id="ev-compare-out")
        gr.Markdown("### Eval run")
        self.page = gr.HTML(NOT_OPEN, elem_id="ev-run")
        with gr.Row():
            self.task_filter = gr.Dropdown(label="task", choices=["all"], value="all", elem_id="ev-filter-task")
            self.outcome_filter = gr.Dropdown(label="outcome", choices=render_evals.OUTCOMES, value="all", elem_id="ev-filter-outcome")
        self.attempts = gr.HTML("", elem_id="ev-attempts")
        self.opened = gr.State(None)  # the run shown: its id

    @property
    def page_outputs(self) -> list[Any]:
        return [self.page, self.task_filter, self.outcome_filter, self.attempts, self.opened]

    def wire(self, blocks: gr.Blocks, tab: gr.Tab, views: gr.Tabs) -> None:
        listed = [self.table, self.ids, self.list_note, self.run_a, self.run_b]
        for trigger in (self.refresh.click, tab.select):
            trigger(self.on_list, outputs=listed, queue=False, api_name=False, show_progress="hidden")
        self.table.select(self.on_select, inputs=[self.ids], outputs=self.page_outputs, queue=False, api_name=False)
        for control in (self.task_filter, self.outcome_filter):
            control.input(
                self.on_filter,
                inputs=[self.opened, self.task_filter, self.outcome_filter],
                outputs=[self.attempts],
                queue=False,
                api_name=False,
                show_progress="hidden",
            )
        self.compare.click(self.on_compare, inputs=[self.run_a, self.run_b], outputs=[self.compared], queue=False, api_name=False)
        blocks.load(self.on_load, outputs=[views, *listed, *self.page_outputs], queue=False, api_name=False)

    # -- reads, in a worker thread ---------------------------------------------------------------
    def _run(self, run_id: str) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]] | None:
        run = eval_runs.get_run(self.jobs.store, run_id)
        if run is None:
            return None
        attempts = eval_runs.run_attempts(self.jobs.store, run_id)
        return run, attempts, render_evals.run_summary(run, attempts)

    def _list(self) -> list[Any]:
        runs = eval_runs.list_runs(self.jobs.store, LIST_LIMIT)
        summaries = {r["id"]: render_evals.run_summary(r, eval_runs.run_attempts(self.jobs.store, r["id"])) for r in runs}
        choices = [(f"{r['id'][:12]} · {r['harness']} · {r['model']} · {len(r['tasks'])} tasks", r["id"]) for r in runs]
        note = f"{len(runs)} eval run(s)" if runs else "no eval runs yet: `harness-env eval` records its runs in this data directory's store"
        return [render_evals.run_rows(runs, summaries), [r["id"] for r in runs], note, gr.update(choices=choices), gr.update(choices=choices)]

    # -- handlers --------------------------------------------------------------------------------
    async def on_list(self) -> list[Any]:
        if self.jobs is None or self.jobs.store is None:
            return [[], [], "this page has no job store", gr.update(), gr.update()]
        return await asyncio.to_thread(self._list)

    async def on_load(self, request: gr.Request) -> list[Any]:
        """/web/?eval=ID opens the Evals tab on that run's page."""
        run_id = (request.query_params.get("eval") or "").strip() if request is not None else ""
        if not run_id or self.jobs is None:
            return [gr.update()] * (6 + len(self.page_outputs))
        return [gr.update(selected="evals-view"), *await self.on_list(), *await self.open(run_id)]

    async def on_select(self, ids: list[str], evt: gr.SelectData) -> list[Any]:
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if not ids or row is None or not 0 <= row < len(ids):
            return [gr.update()] * len(self.page_outputs)
        return await self.open(ids[row])

    async def open(self, run_id: str) -> list[Any]:
        found = await asyncio.to_thread(self._run, run_id) if self.jobs is not None and len(run_id) <= 32 else None
        if found is None:
            return [f"<p>no eval run <code>{escape(run_id)}</code> here</p>", gr.update(choices=["all"], value="all"), gr.update(value="all"), "", None]
        run, attempts, summary = found
        page = await asyncio.to_thread(render_evals.run_page, run, summary, attempts)
        return [
            page,
            gr.update(choices=["all", *run["tasks"]], value="all"),
            gr.update(value="all"),
            render_evals.attempts_html(attempts, run["threshold"], None, None),
            run["id"],
        ]

    async def on_filter(self, run_id: str | None, task: str | None, outcome: str | None) -> str:
        found = await asyncio.to_thread(self._run, run_id) if run_id and self.jobs is not None else None
        if found is None:
            return ""
        run, attempts, _ = found
        return render_evals.attempts_html(attempts, run["threshold"], task, outcome)

    async def on_compare(self, a: str | None, b: str | None) -> str:
        if not a or not b or self.jobs is None:
            return "<p>choose two runs</p>"
        ra, rb = await asyncio.to_thread(self._run, a), await asyncio.to_thread(self._run, b)
        if ra is None or rb is None:
            return "<p>a run chosen is no longer in the store</p>"
        return render_evals.compare_html(ra[0], ra[2], rb[0], rb[2])
