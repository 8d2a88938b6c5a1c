"""The SVG icon family: the agent writes `icon.svg`, previews and refines it; the server renders
it and asks a vision-language judge, after the checks that give 0 without asking.

A request is `task_family="svg_icon"` with the instruction being what to draw, and
`family_options`: `reference_png` (a server-side path; the agent never sees it), `source_prompt`,
`rubric` (dimensions and weights), `renderer` ("chromium" or "resvg", chosen explicitly),
`max_svg_bytes`.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness_env.core.errors import InvalidRequestError, describe_validation_error
from harness_env.core.grading import GradeOutcome
from harness_env.core.paths import confined_path
from harness_env.core.sandbox import safefs
from harness_env.core.sandbox.base import Sandbox
from harness_env.families.base import FamilyExample
from harness_env.families.svg_icon import checks, render
from harness_env.families.svg_icon.judge import DEFAULT_RUBRIC, Judge, JudgeConfig, Rubric
from harness_env.families.svg_icon.pngcodec import PNG_SIGNATURE
from harness_env.families.svg_icon.preview import PREVIEW_COMMAND, preview_files
from harness_env.models import RolloutRequest

ICON_FILE = "icon.svg"
MAX_REFERENCE_BYTES = 8 * 1024 * 1024
REFERENCE_DIR_VAR = "HARNESS_ENV_REFERENCE_DIR"


class SvgIconOptions(BaseModel):
    """svg_icon: the agent writes `icon.svg`; the server renders it and a vision judge (the
    server's `HARNESS_ENV_JUDGE_*`) scores it on the rubric. Verify commands are not used."""

    model_config = ConfigDict(extra="forbid")

    # Declared once: the web form's controls are derived from these fields (server/web/form.py).
    reference_png: str | None = Field(
        default=None,
        max_length=4096,
        title="reference PNG path (optional)",
        description=f"a file on the server under its `{REFERENCE_DIR_VAR}` (absolute, or relative to that directory); only the judge sees it, never the agent",
    )
    source_prompt: str | None = Field(default=None, max_length=20_000, title="source prompt for the judge (optional; default: what to draw)")
    rubric: Rubric | None = Field(
        default=None,
        title="rubric (JSON: dimensions with name, description, weight; blank: the default)",
        json_schema_extra={"example": DEFAULT_RUBRIC.model_dump(mode="json")},
    )
    renderer: Literal["chromium", "resvg"] = Field(default="chromium", title="renderer")
    max_svg_bytes: int = Field(default=256 * 1024, ge=1024, le=16 * 1024 * 1024, title="largest icon.svg read (bytes)")


def instruction_for(prompt: str) -> str:
    return (
        f"Draw this icon as an SVG file: {prompt}\n\n"
        f"Write the SVG to {ICON_FILE} in your working directory (it exists and is empty). It is graded by how it looks "
        f"when rendered at a fixed square size, so give the root <svg> a viewBox. Preview it whenever you like with "
        f"`{PREVIEW_COMMAND}`: it renders {ICON_FILE} to a PNG and reports its size, parse errors and whether it is blank. "
        "Refine it until it looks right, then stop."
    )


def _check_reference(path: str, trusted: bool) -> str:
    p = confined_path(path, REFERENCE_DIR_VAR, "reference_png", trusted=trusted)
    try:
        with open(p, "rb") as f:
            head = f.read(8)
        size = p.stat().st_size
    except OSError as e:
        raise InvalidRequestError(f"reference_png {path!r} cannot be read: {e.strerror or e}") from None
    if head != PNG_SIGNATURE:
        raise InvalidRequestError(f"reference_png {path!r} is not a PNG file")
    if size > MAX_REFERENCE_BYTES:
        raise InvalidRequestError(f"reference_png {path!r} is larger than {MAX_REFERENCE_BYTES} bytes")
    return str(p.resolve())


def read_submission(sandbox: Sandbox, max_bytes: int) -> tuple[bytes | None, str | None]:
    """(the first `max_bytes` of icon.svg, why it was not read). The agent controls the workspace:
    icon.svg is read from the rollout directory (which it cannot replace) without following a link
    anywhere on the way, opened non-blocking and only when it is a regular file, so a link to a host
    file, a FIFO or a device reads as no submission, never as its target and never as a wait.
    Blocking: call it off the event loop."""
    root = getattr(sandbox, "root", None)
    if root is None:  # a sandbox without a host directory: its own reader
        return sandbox.read_file(ICON_FILE, max_bytes=max_bytes), None
    try:
        rel = Path(os.path.normpath(Path(sandbox.workspace) / ICON_FILE)).relative_to(root)
    except ValueError:
        return None, None
    data = safefs.read_regular(root, rel, max_bytes)
    if data is not None:
        return data, None
    try:
        st = safefs.stat_entry(root, rel)
    except OSError:  # missing, or a directory on the way is not one (a link): no submission
        return None, None
    return None, f"{ICON_FILE} is {safefs.kind_of(st.st_mode)}, not a regular file"


class SvgIconFamily:
    name = "svg_icon"
    # Its records (records.py, as `harness-env svg-dataset` writes them): `prompt` is what to draw;
    # source_svg and source stay out (the dataset's own answer must never reach the agent).
    options_model = SvgIconOptions  # its family_options
    instruction_label = "what to draw"  # what the web form calls the instruction
    instruction_key = "prompt"
    record_keys = ("task_id", "prompt", "reference_png", "source_prompt")
    request_keys = ("max_turns", "agent_timeout_s", "verify_timeout_s")
    path_keys = ("reference_png",)
    example = FamilyExample("draw an icon (svg_icon)", "a red square on white", {"renderer": "chromium"})

    def prepare(self, request: RolloutRequest, *, trusted: bool) -> RolloutRequest:
        if request.task.metadata.get("task_family") == self.name:
            return request  # prepared already
        try:
            options = SvgIconOptions.model_validate(request.family_options)
        except ValidationError as e:
            raise InvalidRequestError("svg_icon " + describe_validation_error(e).replace("invalid request: ", "family_options: ")) from None
        if request.task.verify:
            raise InvalidRequestError("svg_icon grades the rendered icon; verify commands are not used: leave verify empty")
        if options.reference_png:
            options.reference_png = _check_reference(options.reference_png, trusted)
        if options.renderer == "chromium":
            render.chromium_path()  # a clear error naming the install command, before any work
        JudgeConfig.from_env().require()
        prompt = request.task.instruction
        task = request.task.model_copy(
            update={
                "instruction": instruction_for(prompt),
                "files": {**request.task.files, ICON_FILE: "", **preview_files()},
                "metadata": {**request.task.metadata, "task_family": self.name, "prompt": prompt},
            }
        )
        return request.model_copy(update={"task": task, "family_options": options.model_dump(mode="json", exclude_none=True)})

    def reference_image(self, family_options: dict[str, Any]) -> str | None:
        path = family_options.get("reference_png")
        return path if isinstance(path, str) else None

    def grader(self, request: RolloutRequest) -> SvgIconGrader:
        return SvgIconGrader(SvgIconOptions.model_validate(request.family_options), request.task.metadata.get("prompt", ""))


class SvgIconGrader:
    def __init__(self, options: SvgIconOptions, prompt: str) -> None:
        self.options = options
        self.prompt = prompt

    async def grade(self, sandbox: Sandbox, request: RolloutRequest) -> GradeOutcome:
        opts = self.options
        evidence: dict[str, Any] = {"renderer": opts.renderer, "zero_reasons": [], "page_valid": False, "timings": {}}
        data, not_regular = await asyncio.to_thread(read_submission, sandbox, opts.max_svg_bytes + 1)
        t0 = time.monotonic()
        if not_regular:
            reasons, rendered = [checks.reason(checks.MISSING, not_regular)], None
        else:
            reasons, rendered = await render.zero_reasons(data, render.RenderSettings(renderer=opts.renderer, max_bytes=opts.max_svg_bytes))
        evidence["timings"]["checks_and_render_s"] = round(time.monotonic() - t0, 3)
        if rendered is not None and rendered.png:
            evidence["rendered_png_b64"] = base64.b64encode(rendered.png).decode()
        if reasons:
            return self._zero(evidence, reasons)
        assert rendered is not None
        evidence["page_valid"] = True
        reference = await asyncio.to_thread(Path(opts.reference_png).read_bytes) if opts.reference_png else None
        rubric = opts.rubric or DEFAULT_RUBRIC
        outcome = await Judge(JudgeConfig.from_env()).score(
            opts.source_prompt or self.prompt,
            rendered.png,
            reference,
            {"renderer": opts.renderer, "svg_bytes": len(data or b""), "size": [rendered.width, rendered.height]},
            rubric,
        )
        evidence["judge"] = outcome.to_evidence(rubric)
        evidence["timings"]["judge_s"] = round(outcome.seconds, 3)
        if outcome.reward is None and outcome.bad_answer:
            why = f"the judge answered {outcome.attempts} time(s) without usable scores (what the picture shows can cause that): {outcome.error}"
            return GradeOutcome(0.0, "judge", [f"{why}: 0"], evidence, error=why, agent_caused=True)
        if outcome.reward is None:
            return GradeOutcome(None, None, evidence=evidence, error=f"the judge failed after {outcome.attempts} attempt(s): {outcome.error}")
        return GradeOutcome(outcome.reward, "judge", [f"judge: weighted mean over {len(rubric.dimensions)} rubric dimensions"], evidence)

    @staticmethod
    def _zero(evidence: dict[str, Any], reasons: list[str]) -> GradeOutcome:
        evidence["zero_reasons"] = reasons
        return GradeOutcome(0.0, "zero_check", [f"zero before the judge: {'; '.join(reasons)}"], evidence)
