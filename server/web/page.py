"""The /web page: layout and event handlers (Gradio Blocks).

Rollouts run through the server's RolloutService, like every other surface, so admission slots,
the endpoint catalog and auth apply equally. The Run handler is an async generator: it starts the
rollout as an asyncio task, reads its PhaseEvents from a queue and yields the growing log (with
elapsed time) until the result arrives. Cancel cancels that task; the engine then cleans up.

Four tabs: Run (the form, the live log, the result area, this page's history), Rollouts (the job
store's rollouts, one rollout's page, result files: rollouts.py), Compare (two rollouts side by side:
compare.py) and Evals (eval runs: evals.py).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import tempfile
import time
from typing import Any

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # the server must not call home

import gradio as gr

from harness_env.core.errors import HarnessEnvError
from harness_env.core.runner import resolve
from harness_env.models import PhaseEvent, RolloutResult
from harness_env.models.jobs import ended_status
from harness_env.server.service import RolloutService
from harness_env.server.web import render
from harness_env.server.web.compare import CompareView
from harness_env.server.web.controls import component, shown_value
from harness_env.server.web.evals import EvalsView
from harness_env.server.web.examples import example_names, get_example
from harness_env.server.web.form import (
    EXPLICIT,
    SHELL_TASK,
    disable_thinking_default,
    endpoint_choices,
    endpoint_note,
    family_controls,
    harness_choices,
    harness_controls,
    instruction_label,
    option_controls,
    request_form,
    task_families,
    to_args,
)
from harness_env.server.web.render_text import md_cell
from harness_env.server.web.result_area import ResultArea, reference_path, text_markdown
from harness_env.server.web.rollouts import RolloutsView
from harness_env.server.web.run_follow import follow, history_entry, outcome

FILE_SLOTS = 8  # file rows the form offers (shown one by one with "Add file")
HISTORY_LIMIT = 50  # rollouts kept per browser session
ACCORDIONS = {"limits": ("limits", True), "capture": ("capture", True), "reward": ("reward", False), "sandbox": ("sandbox limits", False)}


class WebPage:
    """One Blocks app per server; per-browser state lives in gr.State, running tasks here."""

    def __init__(self, service: RolloutService) -> None:
        self.service = service
        self.running: dict[str, asyncio.Task[RolloutResult]] = {}  # session hash -> rollout task
        self._downloads = tempfile.TemporaryDirectory(prefix="harness-env-web-")  # removed in close()
        self.blocks = self._build()

    def close(self) -> None:
        """Server shutdown: stop the rollouts started here (the engine cleans up) and the queue."""
        for task in self.running.values():
            task.cancel()
        self.blocks.close(verbose=False)
        self._downloads.cleanup()  # the result JSONs offered for download; not left for the exit hook

    # -- layout ---------------------------------------------------------------------------------
    def _build(self) -> gr.Blocks:
        with gr.Blocks(title="harness-env", analytics_enabled=False, delete_cache=(3600, 86400)) as blocks:
            gr.Markdown("## harness-env")
            with gr.Tabs(elem_id="views") as self.views:
                with gr.Tab("Run", id="run-view", elem_id="run-tab"):
                    gr.Markdown("Pick an endpoint and a harness, write a task, run it and watch it live.")
                    with gr.Row():
                        with gr.Column(scale=1, min_width=320):
                            gr.Markdown("### Endpoint")
                            self.endpoint = gr.Dropdown(choices=[EXPLICIT], value=EXPLICIT, label="endpoint", elem_id="endpoint")
                            self.endpoint_note = gr.Markdown(endpoint_note([], EXPLICIT))
                            with gr.Group(visible=True) as self.explicit_group:
                                self.base_url = gr.Textbox(label="base URL", placeholder="http://127.0.0.1:8000/v1", elem_id="base-url")
                                self.model = gr.Textbox(label="model", placeholder="Qwen/Qwen3-8B", elem_id="model")
                                self.api_key = gr.Textbox(label="API key", type="password", placeholder="(none)", elem_id="api-key")
                            gr.Markdown("### Harness")
                            controls = {c.name: c for c in option_controls()}
                            self.inputs: dict[str, gr.components.Component] = {}  # by field name: what to_args reads
                            self.harness = self.inputs["harness"] = component(controls["harness"])
                            self.harness_default = controls["harness"].default  # chosen at load, when the server offers it
                            self.harness_inputs: dict[str, dict[str, gr.components.Component]] = {}
                            self.harness_groups: dict[str, gr.Group] = {}
                            for name, (model, fields) in harness_controls().items():  # a harness's own options, shown for it only
                                with gr.Group(visible=False, elem_id=f"{name}-fields") as self.harness_groups[name]:
                                    gr.Markdown(inspect.cleandoc(model.__doc__ or ""))
                                    self.harness_inputs[name] = {c.name: component(c, prefix=f"{name}-") for c in fields}
                            for group in ("harness", *ACCORDIONS):
                                shown = [c for c in controls.values() if c.group == group and c.name not in self.inputs and c.kind != "family"]
                                if group == "harness":
                                    self.inputs.update({c.name: component(c) for c in shown if c.kind != "harness group"})
                                    continue
                                title, is_open = ACCORDIONS[group]
                                with gr.Accordion(title, open=is_open):
                                    self.inputs.update({c.name: component(c) for c in shown})
                            self.disable_thinking = self.inputs["disable_thinking"]
                        with gr.Column(scale=2, min_width=480):
                            gr.Markdown("### Task")
                            # Run, its status and the live log at the top, where the eye is (at 1440 x 857
                            # the form's end is below the fold).
                            with gr.Row():
                                self.run_btn = gr.Button("Run", variant="primary", elem_id="run")
                                self.cancel_btn = gr.Button("Cancel", variant="stop", interactive=False, elem_id="cancel")
                            self.status = text_markdown("status", "idle")
                            self.log = gr.Textbox(label="phase log (live)", lines=6, max_lines=30, interactive=False, elem_id="phase-log", autoscroll=True)
                            # The page opens with the first example loaded (a shell task), so Run works at once.
                            first = get_example(example_names()[0])
                            first_files = list(first.files.items())[:FILE_SLOTS]
                            self.example = gr.Dropdown(choices=example_names(), value=first.name, label="load an example task", elem_id="example")
                            self.task_family = gr.Radio(task_families(), value=SHELL_TASK, label="task family", elem_id="task-family")
                            self.instruction = gr.Textbox(value=first.instruction, label="instruction", lines=4, elem_id="instruction")
                            self.task_id = gr.Textbox(
                                label="task id", placeholder="(none) your name for the task: the Rollouts tab filters by it", elem_id="task-id"
                            )
                            # A family's own options, from its options model (families/base.py), shown for it only.
                            self.family_groups: dict[str, gr.Group] = {}
                            self.family_inputs: dict[str, dict[str, gr.components.Component]] = {}
                            self.family_defaults: dict[str, dict[str, Any]] = {}
                            for name, (model, fields) in family_controls().items():
                                with gr.Group(visible=False, elem_id=f"{name}-fields") as self.family_groups[name]:
                                    gr.Markdown(inspect.cleandoc(model.__doc__ or ""))
                                    self.family_inputs[name] = {c.name: component(c, prefix=f"{name}-") for c in fields}
                                    self.family_defaults[name] = {c.name: c.default for c in fields}
                            with gr.Row():
                                self.setup = gr.Textbox(value="\n".join(first.setup), label="setup commands (one per line)", lines=3, elem_id="setup")
                                self.verify = gr.Textbox(value="\n".join(first.verify), label="verify commands (one per line)", lines=3, elem_id="verify")
                            gr.Markdown("files written into the workspace before setup")
                            self.file_count = gr.State(max(1, len(first_files)))
                            self.file_rows, self.file_paths, self.file_contents = [], [], []
                            for i in range(FILE_SLOTS):
                                path, content = first_files[i] if i < len(first_files) else ("", "")
                                with gr.Row(visible=i < max(1, len(first_files))) as row:
                                    p = gr.Textbox(value=path, label=f"path {i + 1}", scale=1, elem_id=f"file-path-{i}")
                                    c = gr.Textbox(value=content, label="content", lines=3, scale=3, elem_id=f"file-content-{i}")
                                self.file_rows.append(row)
                                self.file_paths.append(p)
                                self.file_contents.append(c)
                            self.add_file = gr.Button("add file", size="sm")
                    gr.Markdown("### Result")
                    self.result = ResultArea(self._downloads.name, list(self.harness_groups))
                    gr.Markdown("### History (this browser session; click a row to reopen)")
                    self.history = gr.State([])
                    self.history_df = gr.Dataframe(headers=render.HISTORY_HEADERS, value=[], interactive=False, elem_id="history")
                with gr.Tab("Rollouts", id="rollouts-view", elem_id="rollouts-tab") as self.rollouts_tab:
                    self.rollouts = RolloutsView(getattr(self.service, "jobs", None), self._downloads.name, list(self.harness_groups))
                with gr.Tab("Compare", id="compare-view", elem_id="compare-tab"):
                    self.compare = CompareView(getattr(self.service, "jobs", None))
                with gr.Tab("Evals", id="evals-view", elem_id="evals-tab") as self.evals_tab:
                    self.evals = EvalsView(getattr(self.service, "jobs", None))
            self._wire(blocks)
            self.rollouts.wire(blocks, self.rollouts_tab, self.views)
            self.compare.wire(blocks, self.views)
            self.evals.wire(blocks, self.evals_tab, self.views)
            self.rollouts.rerun.click(
                self._on_stored_request, inputs=[self.rollouts.opened], outputs=[self.views, self.status, *self._form_outputs], queue=False, api_name=False
            )
            self.rollouts.compare.click(
                lambda rollout_id: [gr.update(selected="compare-view"), rollout_id],
                inputs=[self.rollouts.opened],
                outputs=[self.views, self.compare.a],
                queue=False,
                api_name=False,
            )
        return blocks

    @property
    def _result_outputs(self) -> list[gr.components.Component]:
        return self.result.outputs

    def _wire(self, blocks: gr.Blocks) -> None:
        blocks.load(self._on_load, outputs=[self.endpoint, self.harness], queue=False)
        self.endpoint.change(self._on_endpoint, inputs=[self.endpoint], outputs=[self.explicit_group, self.endpoint_note, self.disable_thinking], queue=False)
        self.harness.change(self._on_harness, inputs=[self.harness], outputs=list(self.harness_groups.values()), queue=False)
        self.example.change(
            self._on_example,
            inputs=[self.example],
            outputs=[
                self.instruction,
                self.setup,
                self.verify,
                self.file_count,
                *self.file_paths,
                *self.file_contents,
                *self.file_rows,
                self.task_family,
                *self.family_groups.values(),
                *self._family_components,
            ],
            queue=False,
        )
        self.task_family.change(self._on_family, inputs=[self.task_family], outputs=[*self.family_groups.values(), self.verify, self.instruction], queue=False)
        self.add_file.click(self._on_add_file, inputs=[self.file_count], outputs=[self.file_count, *self.file_rows], queue=False)
        self.inputs.update(
            endpoint=self.endpoint,
            base_url=self.base_url,
            model=self.model,
            api_key=self.api_key,
            instruction=self.instruction,
            setup=self.setup,
            verify=self.verify,
            task_family=self.task_family,
            task_id=self.task_id,
        )
        # A set: the handler gets one dict {component: value}, read back by field name (form_values).
        inputs = {
            *self.inputs.values(),
            *(c for fields in self.harness_inputs.values() for c in fields.values()),
            *self._family_components,
            self.history,
            *self.file_paths,
            *self.file_contents,
        }
        outputs = [self.status, self.log, self.run_btn, self.cancel_btn, *self._result_outputs, self.history, self.history_df]
        # Slots already bound how many rollouts run at once: no second limit here.
        self.run_btn.click(self._on_run, inputs=inputs, outputs=outputs, concurrency_limit=None, show_progress="hidden", api_name=False)
        self.cancel_btn.click(self._on_cancel, outputs=[self.status], queue=False, api_name=False)
        self.history_df.select(
            self._on_reopen, inputs=[self.history], outputs=[self.status, self.log, *self._form_outputs, *self._result_outputs], queue=False, api_name=False
        )
        # Gradio's autoscroll stops following once the box overflows: scroll to the newest line.
        self.log.change(None, js=FOLLOW_LOG_JS, queue=False)

    # -- small handlers -------------------------------------------------------------------------
    def _on_load(self):
        catalog = self.service.catalog()
        endpoints = endpoint_choices(catalog)
        harnesses = harness_choices(self.service.list_harnesses())
        offered = [value for _, value in harnesses]
        default = self.harness_default if self.harness_default in offered else (offered[0] if offered else None)
        return gr.update(choices=endpoints, value=endpoints[0]), gr.update(choices=harnesses, value=default)

    def _on_endpoint(self, name: str):
        catalog = self.service.catalog()
        return (gr.update(visible=name == EXPLICIT), endpoint_note(catalog, name), gr.update(value=disable_thinking_default(catalog, name)))

    @property
    def _family_components(self) -> list[gr.components.Component]:
        return [c for fields in self.family_inputs.values() for c in fields.values()]

    def _on_example(self, name: str | None):
        if not name:
            return [gr.update()] * (4 + 3 * FILE_SLOTS + 1 + len(self.family_groups) + len(self._family_components))
        ex = get_example(name)
        files = list(ex.files.items())[:FILE_SLOTS]
        count = max(1, len(files))
        paths = [files[i][0] if i < len(files) else "" for i in range(FILE_SLOTS)]
        contents = [files[i][1] if i < len(files) else "" for i in range(FILE_SLOTS)]
        rows = [gr.update(visible=i < count) for i in range(FILE_SLOTS)]
        family = ex.task_family if ex.task_family in self.family_groups else SHELL_TASK
        values = [
            shown_value(ex.family_options.get(field, default) if name == family else default)
            for name, defaults in self.family_defaults.items()
            for field, default in defaults.items()
        ]
        return [
            gr.update(value=ex.instruction, label=instruction_label(family)),
            "\n".join(ex.setup),
            gr.update(value="\n".join(ex.verify), visible=family == SHELL_TASK),
            count,
            *paths,
            *contents,
            *rows,
            family,
            *(gr.update(visible=name == family) for name in self.family_groups),
            *values,
        ]

    def _on_harness(self, harness: str | None):
        shown = [gr.update(visible=harness == name) for name in self.harness_groups]
        return shown[0] if len(shown) == 1 else shown

    def _on_family(self, family: str):
        shell = family not in self.family_groups
        return [
            *(gr.update(visible=name == family) for name in self.family_groups),
            gr.update(visible=shell),
            gr.update(label=instruction_label(None if shell else family)),
        ]

    def _on_add_file(self, count: int):
        count = min(FILE_SLOTS, (count or 1) + 1)
        return [count, *[gr.update(visible=i < count) for i in range(FILE_SLOTS)]]

    async def _on_cancel(self, request: gr.Request):  # async: on the event loop, where the task lives
        task = self.running.get(request.session_hash or "")
        if task is None or task.done():
            return "nothing is running"
        task.cancel()  # the engine closes the sandbox and kills the harness on cancellation
        # The run's own stream says "cancelling", then "cancelled": a status set here could reach the
        # browser after the stream's last word and hide it.
        return gr.update()

    async def _on_stored_request(self, rollout_id: str | None):
        """A stored rollout's request in the form, to run it again (the Run tab opens on it)."""
        request = await asyncio.to_thread(self.rollouts.stored_request, rollout_id) if rollout_id else None
        if request is None:
            return [gr.update(), "**no stored request to load**", *[gr.update()] * len(self._form_outputs)]
        form = request_form(request, self.service.catalog())
        again = "; type its API key again (a key is never kept)" if form["endpoint"] == EXPLICIT else ""
        return [gr.update(selected="run-view"), f"loaded from rollout <code>{md_cell(rollout_id)}</code>{again}", *self._form_view(form)]

    def _on_reopen(self, history: list[dict[str, Any]], evt: gr.SelectData):
        """A run of the history, whole: its status line, its log, the form as it was run (but the
        API key, never kept) and its result."""
        row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
        if not history or row is None or not 0 <= row < len(history):
            return [gr.update()] * (2 + len(self._form_outputs) + len(self._result_outputs))
        entry = history[len(history) - 1 - row]  # the table shows the newest first
        result = RolloutResult.model_validate(entry["result"]) if entry["result"] else None
        return [
            f"{entry['status']} · reopened from the history",
            entry["log"],
            *self._form_view(entry["form"]),
            *self.result.view(result, cancelled=entry["cancelled"], key=entry["id"], reference=entry.get("reference_png")),
        ]

    @property
    def _form_outputs(self) -> list[gr.components.Component]:
        """The form's controls a reopened run sets back (form_values' fields but the API key)."""
        return [
            *(c for name, c in self.inputs.items() if name != "api_key"),
            *(c for fields in self.harness_inputs.values() for c in fields.values()),
            *self._family_components,
            *self.file_paths,
            *self.file_contents,
            self.file_count,
            *self.file_rows,
        ]

    def _form_view(self, form: dict[str, Any]) -> list[Any]:
        """form_values' dict -> the values of _form_outputs."""
        files = list(form.get("files") or [])[:FILE_SLOTS]
        files += [("", "")] * (FILE_SLOTS - len(files))
        count = max([i + 1 for i, (p, c) in enumerate(files) if p or c] or [1])
        return [
            *(form.get(name) for name in self.inputs if name != "api_key"),
            *((form.get(harness) or {}).get(name) for harness, fields in self.harness_inputs.items() for name in fields),
            *((form.get(family) or {}).get(name) for family, fields in self.family_inputs.items() for name in fields),
            *(p or "" for p, _ in files),
            *(c or "" for _, c in files),
            count,
            *(gr.update(visible=i < count) for i in range(FILE_SLOTS)),
        ]

    # -- the run --------------------------------------------------------------------------------
    def form_values(self, data: dict[Any, Any]) -> dict[str, Any]:
        """The form's values by field name (a harness's own under its name) from Gradio's dict of
        the run's inputs."""
        values = {name: data.get(c) for name, c in self.inputs.items()}
        values.update({harness: {name: data.get(c) for name, c in fields.items()} for harness, fields in self.harness_inputs.items()})
        values.update({family: {name: data.get(c) for name, c in fields.items()} for family, fields in self.family_inputs.items()})
        values["files"] = [(data.get(p), data.get(c)) for p, c in zip(self.file_paths, self.file_contents)]
        return values

    async def _on_run(self, request: gr.Request, data: dict[Any, Any]):
        out = dict(zip(["status", "log", "run", "cancel"], [self.status, self.log, self.run_btn, self.cancel_btn]))
        session = getattr(request, "session_hash", None) or ""
        form = self.form_values(data)
        history = data.get(self.history) or []
        secrets = [form.get("api_key") or ""]
        if session in self.running and not self.running[session].done():
            yield {out["status"]: "a rollout is already running in this page: cancel it first"}
            return
        try:
            prepared = await asyncio.to_thread(resolve, to_args(form), trusted=False)  # may read task directories
        except HarnessEnvError as e:  # nothing ran: no earlier run's log or result stays beside the message
            yield {
                **dict(zip(self._result_outputs, self.result.view(None))),
                out["log"]: "",
                out["status"]: f"**not started:** {md_cell(render.redact(str(e), secrets))}",
            }
            return
        events: asyncio.Queue[PhaseEvent] = asyncio.Queue()
        t0 = time.monotonic()
        task = asyncio.create_task(self.service.run(prepared, on_event=events.put_nowait))
        self.running[session] = task
        log: list[str] = []
        try:
            cleared = dict(zip(self._result_outputs, self.result.view(None)))
            yield {
                **cleared,
                out["status"]: render.status_line("running", 0.0, "queued"),
                out["log"]: "",
                out["run"]: gr.update(interactive=False),
                out["cancel"]: gr.update(interactive=True),
            }
            async for status, shown_log in follow(task, events, log, secrets, t0):
                yield {out["status"]: status, **({out["log"]: shown_log} if shown_log is not None else {})}
            result, cancelled, error = outcome(task, secrets)
            wall = time.monotonic() - t0
            state = f"not run: {error}" if error else "cancelled" if cancelled or result is None else ended_status(result)
            if cancelled:
                log.append(f"{wall:7.2f}s  cancelled; the sandbox was cleaned up")
            key = f"{len(history) + 1}-{int(time.time())}"
            # The resolved, checked reference path stays in the server-side session state (gr.State).
            reference = reference_path(prepared.request.task_family, prepared.request.family_options)
            shown_log = render.redact("\n".join(log), secrets)
            entry = history_entry(len(history) + 1, key, form, result, cancelled, render.status_line(state, wall), shown_log, reference, wall)
            history = ([*history, entry])[-HISTORY_LIMIT:]
            shown = await asyncio.to_thread(self.result.view, result, cancelled=cancelled, key=key, reference=reference)  # off the loop
            yield {
                **dict(zip(self._result_outputs, shown)),
                out["status"]: entry["status"],
                out["log"]: shown_log,
                out["run"]: gr.update(interactive=True),
                out["cancel"]: gr.update(interactive=False),
                self.history: history,
                self.history_df: [e["row"] for e in reversed(history)],
            }
        finally:
            if not task.done():  # the page went away or Gradio cancelled the event: stop the rollout too
                task.cancel()
            if self.running.get(session) is task:
                del self.running[session]


FOLLOW_LOG_JS = """() => setTimeout(() => {
  const t = document.querySelector('#phase-log textarea');
  if (t) t.scrollTop = t.scrollHeight;
}, 50)"""


def build_page(service: RolloutService) -> WebPage:
    return WebPage(service)
