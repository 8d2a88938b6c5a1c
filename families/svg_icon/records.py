"""Task records of the SVG icon family: one JSON object per line of a `tasks.jsonl`.

A record says what to draw (`prompt`), where it came from (`source_prompt`, `source`), and how
to run it (`max_turns`, timeouts). `reference_png` is a path to the rendered reference image,
relative to the JSONL file in the generator's output (so the output directory can be moved);
`load_records` resolves it against the file's directory by default.

`source_svg` is the dataset's own SVG (when there is one): it is for scoring and inspection and
must never be shown to the agent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness_env.core.errors import InvalidRequestError, describe_validation_error

MAX_PROMPT_CHARS = 4_000
MAX_SOURCE_PROMPT_CHARS = 100_000
MAX_SOURCE_SVG_BYTES = 1_000_000
TASK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class SvgTaskSource(BaseModel):
    """Where a record came from: which input file, which row, and the dataset's own id."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["parquet", "csv", "manual"] = "manual"
    file: str | None = Field(default=None, max_length=4096)
    # parquet: 0-based row index within the file; csv: 1-based line number of the row.
    row: int | None = Field(default=None, ge=0)
    dataset_id: str | None = Field(default=None, max_length=512)


class SvgTaskRecord(BaseModel):
    """One SVG icon task."""

    model_config = ConfigDict(extra="forbid")

    task_id: str = Field(pattern=TASK_ID_PATTERN)
    prompt: str = Field(min_length=1, max_length=MAX_PROMPT_CHARS, description="What to draw.")
    source_prompt: str | None = Field(default=None, max_length=MAX_SOURCE_PROMPT_CHARS, description="The dataset's original description, verbatim.")
    reference_png: str | None = Field(default=None, max_length=4096, description="Path of the reference PNG (relative to the JSONL file when written).")
    source_svg: str | None = Field(default=None, max_length=MAX_SOURCE_SVG_BYTES, description="The dataset's SVG; never shown to the agent.")
    max_turns: int | None = Field(default=None, ge=1, le=10_000)
    agent_timeout_s: float = Field(default=600.0, gt=0, le=86_400)
    verify_timeout_s: float = Field(default=120.0, gt=0, le=86_400)
    source: SvgTaskSource = Field(default_factory=SvgTaskSource)

    @field_validator("prompt")
    @classmethod
    def _prompt_not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("prompt is blank")
        return v

    def to_json_line(self) -> str:
        return json.dumps(self.model_dump(mode="json", exclude_none=True), ensure_ascii=False, sort_keys=False)


class RecordsError(InvalidRequestError):
    """A tasks JSONL file with bad lines. `problems` has one `file:line: what is wrong` per bad line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "; ".join(problems[:3])
        more = f" (and {len(problems) - 3} more bad lines)" if len(problems) > 3 else ""
        super().__init__(shown + more)


def load_records(path: str | Path, *, resolve_references: bool = True) -> list[SvgTaskRecord]:
    """Read a tasks JSONL file. Blank lines are skipped.

    Every bad line is reported (`RecordsError.problems`), not just the first: not JSON, not an
    object, a field out of bounds, a repeated task_id, or (with `resolve_references`) a
    reference_png that does not exist. With `resolve_references` (the default), a relative
    reference_png is made absolute against the JSONL file's directory.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise InvalidRequestError(f"cannot read tasks file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise InvalidRequestError(f"tasks file {path} is not UTF-8: {e.reason} at byte {e.start}") from None
    base = path.parent
    records: list[SvgTaskRecord] = []
    problems: list[str] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(f"{where}: not valid JSON: {e.msg} at column {e.colno}")
            continue
        if not isinstance(obj, dict):
            problems.append(f"{where}: expected a JSON object, got {type(obj).__name__}")
            continue
        try:
            rec = SvgTaskRecord.model_validate(obj)
        except ValidationError as e:
            problems.append(f"{where}: {describe_validation_error(e).removeprefix('invalid request: ')}")
            continue
        if rec.task_id in seen:
            problems.append(f"{where}: task_id {rec.task_id!r} already used on line {seen[rec.task_id]}")
            continue
        seen[rec.task_id] = lineno
        if resolve_references and rec.reference_png is not None:
            ref = Path(rec.reference_png)
            if not ref.is_absolute():
                ref = base / ref
            if not ref.is_file():
                problems.append(f"{where}: reference_png {rec.reference_png!r} not found (looked at {ref})")
                continue
            rec = rec.model_copy(update={"reference_png": str(ref.resolve())})
        records.append(rec)
    if problems:
        raise RecordsError(problems)
    return records


def write_records(records: list[SvgTaskRecord], path: str | Path) -> None:
    """Write records as JSONL (UTF-8, one object per line), replacing the file atomically."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for rec in records:
            f.write(rec.to_json_line() + "\n")
    tmp.replace(path)
