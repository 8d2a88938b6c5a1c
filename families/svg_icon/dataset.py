"""Build SVG icon task records from local icon-dataset shards and/or a CSV of briefs.

Inputs: parquet shards of an icon dataset (`--parquet`, e.g. OmniSVG/MMSVG-Icon, as local files)
and CSV files of briefs (`--csv`); how they are read is dataset_inputs.py.

Filters, applied to each row in this order (cheapest first), each counted in the provenance:
  empty_prompt     no description / blank prompt
  too_long         SVG larger than --max-svg-bytes, or prompt longer than --max-prompt-chars
  malformed        not UTF-8, not XML, root is not <svg>, a DOCTYPE/ENTITY declaration, an external
                   reference (href not '#...' or 'data:'), or the renderer refuses it
  duplicate_svg    same SVG as a kept record (after XML canonicalisation)
  duplicate_prompt same prompt as a kept record (case- and whitespace-insensitive)
  blank            the rendered reference is near-uniform (no visible drawing)
A row is counted once, under the first filter that rejects it. Rows are read in input order (files
as given, rows in file order); `--seed` shuffles them first; `--limit N` stops after N kept records.

Outputs in the output directory: `tasks.jsonl` (one SvgTaskRecord per line, reference_png relative
to it), `refs/<task_id>.png` (the rendered references), `provenance.json` (inputs with row counts
and sha256, counts per filter with a few examples each, settings, tool version). A one-paragraph
summary is printed.

Rendering goes through a `renderer(svg_text, width, height) -> png_bytes` parameter (default
resvg-py) so the family's own renderer can be plugged in.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import shutil
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import NoReturn

from harness_env.core.distribution import package_version
from harness_env.families.svg_icon import checks
from harness_env.families.svg_icon.dataset_inputs import DatasetError, Input, Row, Settings, open_inputs
from harness_env.families.svg_icon.records import MAX_PROMPT_CHARS, MAX_SOURCE_PROMPT_CHARS, SvgTaskRecord, write_records

__all__ = ["DatasetError", "Report", "Settings", "build_parser", "generate", "main", "render_with_resvg"]

EXIT_BAD_INPUT = 2
FILTERS = ("empty_prompt", "too_long", "malformed", "duplicate_svg", "duplicate_prompt", "blank")
EXAMPLES_PER_FILTER = 5

Renderer = Callable[[str, int, int], bytes]
"""(svg_text, width, height) -> PNG bytes; raises ValueError when the SVG cannot be rendered."""
BlankCheck = Callable[[bytes], bool]
"""PNG bytes -> True when the image shows nothing (near-uniform)."""


# --------------------------------------------------------------------------------------------
# Rendering and checks


def render_with_resvg(svg_text: str, width: int, height: int) -> bytes:
    """The default renderer: resvg-py on a white background."""
    import resvg_py

    return bytes(resvg_py.svg_to_bytes(svg_string=svg_text, width=width, height=height, background="#ffffff"))


def _svg_problem(svg_text: str) -> str | None:
    """Why this text is not an acceptable standalone SVG document (checks.inspect_svg, plus no
    external references: resvg would read local files), or None when it is."""
    reasons = checks.inspect_svg(svg_text, max_bytes=len(svg_text.encode()) + 1)  # length is its own filter
    if reasons:
        return reasons[0]
    refs = checks.external_refs(svg_text)
    if refs:
        return f"external reference {refs[0][:80]!r} (only '#id' and 'data:' hrefs are allowed)"
    return None


def _clean_prompt(text: str) -> str:
    return " ".join(text.split())


def _prompt_key(prompt: str) -> str:
    return _clean_prompt(prompt).casefold().rstrip(".!;: ")


def _svg_key(svg_text: str) -> str:
    try:
        canon = ET.canonicalize(svg_text, strip_text=True)
    except ET.ParseError:
        canon = " ".join(svg_text.split())
    return hashlib.sha256(canon.encode()).hexdigest()


def _safe_id(text: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.")
    return s[:100] or "x"


# --------------------------------------------------------------------------------------------
# Inputs


# --------------------------------------------------------------------------------------------
# The generator


@dataclass
class Report:
    """What `generate` did: the kept records and the provenance written beside them."""

    records: list[SvgTaskRecord]
    provenance: dict
    out_dir: Path

    def summary(self) -> str:
        c = self.provenance["counts"]
        dropped = ", ".join(f"{k} {v}" for k, v in c["filtered"].items() if v) or "none"
        inputs = self.provenance["inputs"]
        n_pq = sum(1 for i in inputs if i["kind"] == "parquet")
        n_csv = len(inputs) - n_pq
        limit = " (stopped at --limit)" if self.provenance["stopped_at_limit"] else ""
        return (
            f"kept {c['kept']} of {c['examined']} rows examined ({c['rows_total']} in {n_pq} parquet and "
            f"{n_csv} csv files){limit}; filtered: {dropped}; wrote {self.out_dir / 'tasks.jsonl'}, "
            f"{self.out_dir / 'refs'}/, {self.out_dir / 'provenance.json'}"
        )


def _prepare_out_dir(out_dir: Path, overwrite: bool) -> None:
    ours = [out_dir / "tasks.jsonl", out_dir / "provenance.json", out_dir / "refs"]
    if out_dir.exists() and not out_dir.is_dir():
        raise DatasetError(f"output {out_dir} exists and is not a directory")
    existing = [p for p in ours if p.exists()]
    if existing and not overwrite:
        raise DatasetError(f"output directory {out_dir} already holds {existing[0].name} (pass --overwrite to replace it)")
    for p in existing:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    (out_dir / "refs").mkdir(parents=True, exist_ok=True)


def generate(
    out_dir: str | Path,
    *,
    parquet: list[str | Path] = (),
    csv_files: list[str | Path] = (),
    settings: Settings | None = None,
    renderer: Renderer = render_with_resvg,
    is_blank: BlankCheck = checks.is_blank,
    overwrite: bool = False,
) -> Report:
    """Filter the inputs' rows into task records; write tasks.jsonl, refs/ and provenance.json.

    Raises DatasetError for bad input (missing file or column, bad CSV reference), before writing
    anything when the problem is in a file header, or mid-way for a bad CSV row.
    """
    settings = settings or Settings()
    out_dir = Path(out_dir)
    if not parquet and not csv_files:
        raise DatasetError("no input: give at least one --parquet shard or --csv file of briefs")
    if settings.max_prompt_chars > MAX_PROMPT_CHARS:
        raise DatasetError(f"--max-prompt-chars must be at most {MAX_PROMPT_CHARS}")
    streams = open_inputs(list(parquet), list(csv_files), settings)  # before touching the output directory
    inputs = [inp for inp, _ in streams]
    _prepare_out_dir(out_dir, overwrite)

    def all_rows() -> Iterator[tuple[Input, Row]]:
        for inp, rows in streams:
            for row in rows:
                yield inp, row

    ordered: Iterator[tuple[Input, Row]] = all_rows()
    if settings.seed is not None:
        materialised = list(ordered)
        random.Random(settings.seed).shuffle(materialised)
        ordered = iter(materialised)

    counts = dict.fromkeys(FILTERS, 0)
    examples: dict[str, list[str]] = {k: [] for k in FILTERS}
    seen_svg: dict[str, str] = {}
    seen_prompt: dict[str, str] = {}
    used_ids: set[str] = set()
    records: list[SvgTaskRecord] = []
    examined = 0
    stopped = False
    size = settings.render_size

    def drop(kind: str, row: Row, why: str) -> None:
        counts[kind] += 1
        if len(examples[kind]) < EXAMPLES_PER_FILTER:
            examples[kind].append(f"{row.where}: {why}")

    for inp, row in ordered:
        if settings.limit is not None and len(records) >= settings.limit:
            stopped = True
            break
        examined += 1
        inp.rows_examined += 1
        text = row.text.decode("utf-8", "replace") if isinstance(row.text, bytes) else row.text
        prompt = _clean_prompt(text) if isinstance(text, str) else ""
        if not prompt:
            drop("empty_prompt", row, "no description")
            continue
        svg = row.svg
        svg_bytes = len(svg) if isinstance(svg, bytes) else len(svg.encode("utf-8", "replace")) if isinstance(svg, str) else 0
        if svg_bytes > settings.max_svg_bytes:
            drop("too_long", row, f"SVG is {svg_bytes} bytes (--max-svg-bytes {settings.max_svg_bytes})")
            continue
        if len(prompt) > settings.max_prompt_chars:
            drop("too_long", row, f"prompt is {len(prompt)} characters (--max-prompt-chars {settings.max_prompt_chars})")
            continue
        if isinstance(svg, bytes):
            try:
                svg = svg.decode("utf-8")
            except UnicodeDecodeError:
                drop("malformed", row, "SVG is not UTF-8")
                continue
        if row.png is None and not (isinstance(svg, str) and svg.strip()):
            if inp.kind == "parquet":
                drop("malformed", row, "no SVG")
                continue
            svg = None  # a brief without a reference image
        svg_key = None
        if svg is not None:
            svg = svg.lstrip("\ufeff").strip()
            problem = _svg_problem(svg)
            if problem:
                drop("malformed", row, problem)
                continue
            svg_key = _svg_key(svg)
            if svg_key in seen_svg:
                drop("duplicate_svg", row, f"same SVG as {seen_svg[svg_key]}")
                continue
        prompt_key = _prompt_key(prompt)
        if prompt_key in seen_prompt:
            drop("duplicate_prompt", row, f"same prompt as {seen_prompt[prompt_key]}")
            continue
        png = row.png
        if svg is not None:
            try:
                png = renderer(svg, size, size)
            except ValueError as e:
                drop("malformed", row, f"cannot be rendered: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}")
                continue
        if png is not None and is_blank(png):
            drop("blank", row, "the rendered image is near-uniform")
            continue

        if inp.kind == "parquet":
            base_id = f"{settings.task_id_prefix}-{_safe_id(row.dataset_id) if row.dataset_id else svg_key[:12]}"
        elif row.dataset_id:
            base_id = _safe_id(row.dataset_id)
        else:
            base_id = f"brief-{hashlib.sha256(prompt_key.encode()).hexdigest()[:12]}"
        task_id, n = base_id, 1
        while task_id in used_ids:
            n += 1
            task_id = f"{base_id}-{n}"
        used_ids.add(task_id)
        ref_rel = None
        if png is not None:
            ref_rel = f"refs/{task_id}.png"
            (out_dir / ref_rel).write_bytes(png)
        source_prompt = text[:MAX_SOURCE_PROMPT_CHARS]
        records.append(
            SvgTaskRecord(
                task_id=task_id,
                prompt=prompt,
                source_prompt=source_prompt,
                reference_png=ref_rel,
                source_svg=svg if settings.include_source_svg else None,
                max_turns=settings.max_turns,
                agent_timeout_s=settings.agent_timeout_s,
                verify_timeout_s=settings.verify_timeout_s,
                source=row.source,
            )
        )
        if svg_key is not None:
            seen_svg[svg_key] = row.where
        seen_prompt[prompt_key] = row.where

    write_records(records, out_dir / "tasks.jsonl")
    provenance = {
        "tool": {"name": "harness-env svg-dataset", "version": package_version()},
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "inputs": [inp.describe() for inp in inputs],
        "settings": asdict(settings),
        "filter_order": list(FILTERS),
        "counts": {"rows_total": sum(i.rows for i in inputs), "examined": examined, "filtered": counts, "kept": len(records)},
        "stopped_at_limit": stopped,
        "examples": {k: v for k, v in examples.items() if v},
        "outputs": {"tasks": "tasks.jsonl", "refs_dir": "refs", "references": sum(1 for r in records if r.reference_png)},
    }
    (out_dir / "provenance.json").write_text(json.dumps(provenance, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return Report(records=records, provenance=provenance, out_dir=out_dir)


# --------------------------------------------------------------------------------------------
# Command line (wired as `harness-env svg-dataset` by cli.py)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, not usage + message
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message} (see --help)\n")


def build_parser(prog: str = "harness-env svg-dataset") -> argparse.ArgumentParser:
    p = _Parser(
        prog=prog,
        description="Build SVG icon task records (tasks.jsonl, refs/, provenance.json) from local parquet shards of an icon dataset and/or a CSV of briefs.",
    )
    p.add_argument("--parquet", action="append", default=[], metavar="FILE", help="a parquet shard (repeat for several), e.g. of OmniSVG/MMSVG-Icon")
    p.add_argument(
        "--csv", action="append", default=[], metavar="FILE", help="a CSV of briefs: prompt|description|brief, optional task_id|id and reference_image columns"
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--overwrite", action="store_true", help="replace a previous output in --out")
    d = Settings()
    p.add_argument("--svg-column", default=d.svg_column, help=f"parquet column with the SVG (default {d.svg_column})")
    p.add_argument("--text-column", default=d.text_column, help=f"parquet column with the description (default {d.text_column})")
    p.add_argument("--id-column", default=None, help="parquet column with a row id (default: 'id' when present)")
    p.add_argument("--csv-prompt-column", default=None, help="CSV column with the prompt")
    p.add_argument("--csv-image-column", default=None, help="CSV column with a reference image path")
    p.add_argument("--max-svg-bytes", type=int, default=d.max_svg_bytes)
    p.add_argument("--max-prompt-chars", type=int, default=d.max_prompt_chars)
    p.add_argument("--render-size", type=int, default=d.render_size, help="reference PNG width and height")
    p.add_argument("--limit", type=int, default=None, help="stop after N kept records")
    p.add_argument("--seed", type=int, default=None, help="shuffle rows with this seed before filtering")
    p.add_argument("--task-id-prefix", default=d.task_id_prefix)
    p.add_argument("--max-turns", type=int, default=None)
    p.add_argument("--agent-timeout-s", type=float, default=d.agent_timeout_s)
    p.add_argument("--verify-timeout-s", type=float, default=d.verify_timeout_s)
    p.add_argument("--no-source-svg", action="store_true", help="do not store the dataset's SVG in the records")
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with a summary on stdout; exit 2 with one line on stderr for bad input."""
    parser = build_parser()
    args = parser.parse_args(argv)
    positive = {
        "--max-svg-bytes": args.max_svg_bytes,
        "--max-prompt-chars": args.max_prompt_chars,
        "--render-size": args.render_size,
        "--limit": args.limit,
        "--max-turns": args.max_turns,
        "--agent-timeout-s": args.agent_timeout_s,
        "--verify-timeout-s": args.verify_timeout_s,
    }
    for flag, value in positive.items():
        if value is not None and not value > 0:
            parser.error(f"{flag} must be positive")
    if args.render_size > 4096:
        parser.error("--render-size must be at most 4096")
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,26}", args.task_id_prefix):
        parser.error("--task-id-prefix must be 1-27 characters of letters, digits, '.', '_' or '-'")
    settings = Settings(
        svg_column=args.svg_column,
        text_column=args.text_column,
        id_column=args.id_column,
        csv_prompt_column=args.csv_prompt_column,
        csv_image_column=args.csv_image_column,
        max_svg_bytes=args.max_svg_bytes,
        max_prompt_chars=args.max_prompt_chars,
        render_size=args.render_size,
        limit=args.limit,
        seed=args.seed,
        task_id_prefix=args.task_id_prefix,
        max_turns=args.max_turns,
        agent_timeout_s=args.agent_timeout_s,
        verify_timeout_s=args.verify_timeout_s,
        include_source_svg=not args.no_source_svg,
    )
    try:
        report = generate(args.out, parquet=args.parquet, csv_files=args.csv, settings=settings, overwrite=args.overwrite)
    except DatasetError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(report.summary())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
