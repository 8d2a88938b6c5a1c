"""The Rollouts view of /web: the stored rollouts (the job store, newest first, filtered), one
rollout's page (its phase log, status and result, shown by the same ResultArea as a fresh run),
reachable as /web/?rollout=ID, following a running one live, and result files opened from disk.

Everything is read through the server's JobManager (its listing and get; its store's events), off
the event loop as the manager does itself. A page following a running rollout polls (a gr.Timer
every FOLLOW_S): the store is the one place every replica's jobs are, and a poll holds no worker.
"""

from __future__ import annotations

import asyncio
import os
import time
import zlib
from typing import Any

import gradio as gr

from harness_env.models import ENDED_STATUSES, PhaseEvent, RolloutJob, RolloutResult
from harness_env.server.store.codec import decompress
from harness_env.server.web import render
from harness_env.server.web.render_request import request_html
from harness_env.server.web.render_text import format_reward, md_cell
from harness_env.server.web.result_area import ResultArea, reference_path, text_markdown
from harness_env.server.web.result_file import MAX_RESULT_FILE_BYTES, parse_result_file

__all__ = ["MAX_RESULT_FILE_BYTES", "RolloutsView", "parse_result_file"]

STATUSES = ["queued", "running", "finished", "failed", "cancelled", "interrupted"]
HEADERS = ["created", "rollout", "status", "harness", "task", "reward", "wall time (s)", "error kind"]
LIST_LIMIT = 100  # rows a page of the list shows; "older" pages on
FOLLOW_S = 1.0  # how often a running rollout's page reads the store
MAX_LOG_EVENTS = 5_000  # events shown in a rollout's phase log
# The address bar follows the rollout shown, so it can be copied and shared as it is.
ADDRESS_JS = """() => setTimeout(() => {
  const a = document.querySelector('#ro-share');
  history.replaceState(null, '', a ? a.getAttribute('href') : location.pathname);
}, 50)"""
NOT_OPEN = "Click a rollout in the list, or open `/web/?rollout=ID`."


def list_rows(items: list[Any]) -> list[list[Any]]:
    """RolloutListItems -> the table's rows."""
    return [
        [
            time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(i.created_at)),
            i.rollout_id,
            i.status,
            i.harness,
            i.task_id or "-",
            format_reward(i.reward),
            "-" if i.wall_s is None else round(i.wall_s, 2),
            i.error_kind or "-",
        ]
        for i in items
    ]


class RolloutsView:
    """Built inside the page's Blocks (in its Rollouts tab); `jobs`: the server's JobManager (None
    when the page is built without a server)."""

    def __init__(self, jobs: Any, downloads: str, harness_names: list[str]) -> None:
        self.jobs = jobs
        gr.Markdown("### Stored rollouts (newest first; click one to open it)")
        with gr.Row():
            self.status_filter = gr.Dropdown(choices=STATUSES, value=[], multiselect=True, label="status", elem_id="ro-filter-status")
            self.harness_filter = gr.Textbox(label="harness", placeholder="(any)", elem_id="ro-filter-harness")
            self.task_filter = gr.Textbox(label="task id", placeholder="(any)", elem_id="ro-filter-task")
            self.refresh = gr.Button("refresh", size="sm", elem_id="ro-refresh")
        with gr.Row():
            self.list_note = text_markdown("ro-list-note")
            self.older = gr.Button("older", size="sm", visible=False, elem_id="ro-older")
        self.cursor = gr.State(None)  # the next page's cursor (the store's `before`)
        self.table = gr.Dataframe(headers=HEADERS, value=[], interactive=False, elem_id="ro-list")
        self.ids = gr.State([])  # the rollout id of each row
        with gr.Row():
            self.file = gr.File(
                label="open a result file (RolloutResult JSON, compact JSON, or JSONL of them)",
                file_types=[".json", ".jsonl"],
                type="filepath",
                elem_id="ro-file",
            )
            self.file_pick = gr.Dropdown(label="result in the file", choices=[], visible=False, elem_id="ro-file-pick")
        # The open file: its path in Gradio's upload cache and how many results it holds, not the
        # results (a session's state outlives its tab by an hour; a pick reads the file again).
        self.file_results = gr.State(None)
        gr.Markdown("### Rollout")
        self.title = text_markdown("ro-title", NOT_OPEN)
        self.status = text_markdown("ro-status")
        with gr.Row():
            self.cancel = gr.Button("Cancel", variant="stop", size="sm", visible=False, elem_id="ro-cancel")
            self.rerun = gr.Button("load into the form", size="sm", visible=False, elem_id="ro-rerun")
            self.compare = gr.Button("compare with another", size="sm", visible=False, elem_id="ro-compare")
        self.request = gr.HTML("", elem_id="ro-request")
        self.opened = gr.State(None)  # the id of the stored rollout shown
        self.log = gr.Textbox(label="phase log", lines=10, max_lines=30, interactive=False, elem_id="ro-log", autoscroll=True)
        self.result = ResultArea(downloads, harness_names, prefix="ro-")
        self.followed = gr.State(None)  # {"id", "after", "log"}: the rollout the page shows while it runs
        self.timer = gr.Timer(FOLLOW_S, active=False)

    @property
    def page_outputs(self) -> list[Any]:
        return [
            self.title,
            self.status,
            self.log,
            *self.result.outputs,
            self.followed,
            self.timer,
            self.cancel,
            self.rerun,
            self.compare,
            self.request,
            self.opened,
        ]

    def wire(self, blocks: gr.Blocks, tab: gr.Tab, views: gr.Tabs) -> None:
        filters = [self.status_filter, self.harness_filter, self.task_filter]
        listed = [self.table, self.ids, self.list_note, self.cursor, self.older]
        for trigger in (self.refresh.click, self.status_filter.change, self.harness_filter.submit, self.task_filter.submit, tab.select):
            trigger(self.on_list, inputs=filters, outputs=listed, queue=False, api_name=False, show_progress="hidden")
        self.older.click(self.on_list, inputs=[*filters, self.cursor], outputs=listed, queue=False, api_name=False, show_progress="hidden")
        blocks.load(self.on_load, inputs=filters, outputs=[views, *listed, *self.page_outputs], queue=False, api_name=False)
        self.table.select(self.on_select, inputs=[self.ids], outputs=self.page_outputs, queue=False, api_name=False)
        self.timer.tick(self.on_tick, inputs=[self.followed], outputs=self.page_outputs, queue=False, api_name=False, show_progress="hidden")
        self.file.upload(self.on_file, inputs=[self.file], outputs=[self.file_results, self.file_pick, *self.page_outputs], queue=False, api_name=False)
        self.title.change(None, js=ADDRESS_JS, queue=False)
        self.cancel.click(self.on_cancel, inputs=[self.opened], outputs=[self.status, self.cancel], queue=False, api_name=False)
        self.file_pick.input(self.on_pick, inputs=[self.file_results, self.file_pick], outputs=self.page_outputs, queue=False, api_name=False)

    # -- the list ------------------------------------------------------------------------------
    async def on_list(self, statuses: list[str] | None, harness: str | None, task: str | None, before: str | None = None) -> list[Any]:
        """A page of the list, newest first: the first, or the one after cursor `before`."""
        if self.jobs is None:
            return [[], [], "this page has no job store", None, gr.update(visible=False)]
        page = await self.jobs.list(
            statuses=list(statuses or []),
            task_id=(task or "").strip() or None,
            harness=(harness or "").strip() or None,
            before=int(before) if before else None,
            limit=LIST_LIMIT,
        )
        where = "older " if before else ""
        note = f"{len(page.items)} {where}rollout(s)" + (' (more with "older"; "refresh" goes back to the newest)' if page.next_cursor else "")
        return [list_rows(page.items), [i.rollout_id for i in page.items], note, page.next_cursor, gr.update(visible=bool(page.next_cursor))]

    async def on_load(self, statuses: list[str] | None, harness: str | None, task: str | None, request: gr.Request) -> list[Any]:
        """/web/?rollout=ID opens the Rollouts tab on that rollout's page."""
        rollout_id = (request.query_params.get("rollout") or "").strip() if request is not None else ""
        if not rollout_id:
            return [gr.update()] * (6 + len(self.page_outputs))
        listed = await self.on_list(statuses, harness, task)
        return [gr.update(selected="rollouts-view"), *listed, *await self.open(rollout_id)]

    async def on_select(self, ids: list[str], evt: gr.SelectData) -> list[Any]:
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if not ids or row is None or not 0 <= row < len(ids):
            return [gr.update()] * len(self.page_outputs)
        return await self.open(ids[row])

    # -- one rollout ---------------------------------------------------------------------------
    async def _events(self, rollout_id: str, after: int) -> tuple[list[str], int]:
        """Log lines of the rollout's events after seq `after`, and the last seq read."""
        lines: list[str] = []
        while len(lines) < MAX_LOG_EVENTS:
            rows = await asyncio.to_thread(self.jobs.store.events_after, rollout_id, after)
            for seq, data in rows:
                lines.append(render.log_line(PhaseEvent.model_validate_json(data)))
                after = seq
            if len(rows) < 500:  # the store's page
                break
        return lines, after

    def _status(self, job: RolloutJob) -> str:
        if job.ended:
            return render.status_line(job.status, job.wall_s or 0.0)
        phase = job.phases[-1].phase if job.phases else ""
        return render.status_line(job.status, time.time() - (job.started_at or job.created_at), phase)

    async def open(self, rollout_id: str) -> list[Any]:
        """A stored rollout's page: its log so far, its status and, once it ended, its result;
        a running one is followed (the timer)."""
        out = dict.fromkeys(self.page_outputs, gr.update())
        job = await self.jobs.get(rollout_id) if self.jobs is not None and len(rollout_id) <= 32 else None
        if job is None:
            out.update(zip(self.result.outputs, self.result.view(None)))
            out.update(
                {
                    self.title: f"**no rollout <code>{md_cell(rollout_id)}</code>** here (never run here, or removed by retention)",
                    self.status: "",
                    self.log: "",
                    self.followed: None,
                    self.timer: gr.Timer(active=False),
                    **self._no_request(),
                }
            )
            return list(out.values())
        lines, after = await self._events(job.rollout_id, -1)
        request = await asyncio.to_thread(self.stored_request, job.rollout_id)
        out.update(
            {
                self.title: self._title(job),
                self.log: "\n".join(lines),
                self.request: request_html(request),
                self.rerun: gr.update(visible=request is not None),
                self.compare: gr.update(visible=True),
                self.opened: job.rollout_id,
            }
        )
        out.update(await self._shown(job, {"id": job.rollout_id, "after": after, "log": lines}))
        return list(out.values())

    def _title(self, job: RolloutJob) -> str:
        link = f"?rollout={job.rollout_id}"
        return (
            f"**rollout <code>{md_cell(job.rollout_id)}</code>** · task <code>{md_cell(job.task_id or '-')}</code> · {md_cell(job.harness)} · "
            f'model <code>{md_cell(job.model or "-")}</code> · <a id="ro-share" href="{link}">link to this rollout</a>'
        )

    async def _shown(self, job: RolloutJob, followed: dict[str, Any]) -> dict[Any, Any]:
        """Status and result of `job`: the whole result once it ended (the timer stops), else the
        result area cleared and the timer on."""
        out: dict[Any, Any] = {self.status: self._status(job), self.cancel: gr.update(visible=job.status not in ENDED_STATUSES)}
        if job.status in ENDED_STATUSES:
            full = await self.jobs.get(job.rollout_id, "full")
            result = full.result if full is not None else None
            reference = await asyncio.to_thread(self._reference, job.rollout_id) if result is not None and result.grading else None
            # Rendered off the event loop: a long rollout's JSON and conversation take a while.
            shown = await asyncio.to_thread(self.result.view, result, cancelled=job.status == "cancelled", key=job.rollout_id, reference=reference)
            out.update(zip(self.result.outputs, shown))
            out.update({self.followed: None, self.timer: gr.Timer(active=False)})
        else:
            out.update(zip(self.result.outputs, self.result.view(None)))
            out.update({self.followed: followed, self.timer: gr.Timer(active=True)})
        return out

    def stored_request(self, rollout_id: str) -> dict[str, Any] | None:
        """The rollout's request as the store holds it (RolloutRequest's JSON, its key masked)."""
        store = getattr(self.jobs, "store", None)  # a page built without a server has none
        row = store.get(rollout_id) if store is not None else None
        try:
            request = decompress(row["request"]) if row and row.get("request") else None
        except (ValueError, TypeError, zlib.error):
            return None
        return request if isinstance(request, dict) else None

    def _reference(self, rollout_id: str) -> str | None:
        """The reference PNG path of a task-family rollout: the one its stored request holds (the
        family resolved and checked it when the rollout was accepted; never sent to the page)."""
        request = self.stored_request(rollout_id) or {}
        return reference_path(request.get("task_family"), request.get("family_options"))

    def _no_request(self) -> dict[Any, Any]:
        hidden = gr.update(visible=False)
        return {self.cancel: hidden, self.rerun: hidden, self.compare: hidden, self.request: "", self.opened: None}

    async def on_cancel(self, opened: str | None) -> list[Any]:
        """Cancel the running rollout shown (wherever it runs); the timer shows how it ended."""
        job = await self.jobs.cancel(opened) if opened and self.jobs is not None else None
        if job is None:
            return ["nothing to cancel", gr.update(visible=False)]
        return [self._status(job) if job.ended else "**cancelling...**", gr.update(visible=not job.ended)]

    async def on_tick(self, followed: dict[str, Any] | None) -> dict[Any, Any]:
        if not followed or self.jobs is None:
            return {self.timer: gr.Timer(active=False)}
        job = await self.jobs.get(followed["id"])
        if job is None:
            return {self.status: "**removed** from the store", self.followed: None, self.timer: gr.Timer(active=False)}
        lines, after = await self._events(job.rollout_id, followed["after"])
        log = (followed["log"] + lines)[-MAX_LOG_EVENTS:]
        out: dict[Any, Any] = {self.log: "\n".join(log)} if lines else {}
        if job.ended:
            return {**out, **await self._shown(job, {})}
        return {**out, self.status: self._status(job), self.followed: {"id": job.rollout_id, "after": after, "log": log}}

    # -- result files --------------------------------------------------------------------------
    async def on_file(self, path: str | None) -> list[Any]:
        """A result file opened from disk. Reading, checking and rendering it all happen off the
        event loop: a file is as large as the limit allows, and /health must not wait for it."""
        if not path:
            return [gr.update(), gr.update(), *[gr.update()] * len(self.page_outputs)]
        return await asyncio.to_thread(self._open_file, path)

    def _open_file(self, path: str) -> list[Any]:
        name = md_cell(os.path.basename(path))
        try:
            results = parse_result_file(path)
        except (OSError, ValueError) as e:
            return [[], gr.update(choices=[], value=None, visible=False), *self._file_page(None, f"**could not open {name}:** {md_cell(str(e))}")]
        choices = [(f"{n}: {r.task_id or '-'} · {r.harness} · reward {format_reward(r.reward)}", str(n - 1)) for n, r in enumerate(results, 1)]
        return [
            {"path": path, "count": len(results)},
            gr.update(choices=choices, value="0", visible=len(results) > 1),
            *self._file_page(results[0], f"**{name}**, result 1 of {len(results)}"),
        ]

    def on_pick(self, opened: dict[str, Any] | None, pick: str | None) -> list[Any]:
        """Another result of the file, read again (a sync handler: Gradio runs it in its thread pool)."""
        if not opened or pick is None or not pick.isdigit() or not 0 <= int(pick) < opened["count"]:
            return [gr.update()] * len(self.page_outputs)
        try:
            results = parse_result_file(opened["path"])
        except (OSError, ValueError) as e:
            return self._file_page(None, f"**could not read the file again:** {md_cell(str(e))}")
        if int(pick) >= len(results):
            return [gr.update()] * len(self.page_outputs)
        return self._file_page(results[int(pick)], f"result {int(pick) + 1} of {len(results)} in the file")

    def _file_page(self, result: RolloutResult | None, title: str) -> list[Any]:
        """A result from a file: no log (a file has no events), its phases as the status."""
        status = "" if result is None else render.status_line("from a file", result.wall_s)
        phases = (
            "" if result is None else "\n".join(f"{p.name:<8} {'ok' if p.ok else 'failed'}  {p.duration_s:.2f} s  {p.detail}".rstrip() for p in result.phases)
        )
        key = f"file-{int(time.time() * 1000)}"
        return [title, status, phases, *self.result.view(result, key=key), None, gr.Timer(active=False), *self._no_request().values()]
