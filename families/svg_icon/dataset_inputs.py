"""The inputs of the SVG icon dataset generator (dataset.py): its settings, and the rows of its
parquet shards and CSV briefs.

  * parquet shards of an icon dataset (one or more `--parquet`), with a column holding the SVG
    source and one holding its description. The defaults match OmniSVG/MMSVG-Icon (`id`, `svg`,
    `description`); these machines cannot download it, so shards are passed as local files.
  * CSV files of briefs (`--csv`): a prompt column (`prompt`, `description` or `brief`), an
    optional id column (`task_id` or `id`) and an optional reference image column
    (`reference_image`, `reference_png`, `reference` or `image`; a PNG or an SVG file, a relative
    path is resolved against the CSV's directory).

Every input is opened (file read, columns checked) by `open_inputs` before the generator writes
anything, so a bad input leaves the output directory untouched.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness_env.core.errors import InvalidRequestError
from harness_env.families.svg_icon.pngcodec import PNG_SIGNATURE
from harness_env.families.svg_icon.records import SvgTaskSource

CSV_PROMPT_COLUMNS = ("prompt", "description", "brief")
CSV_ID_COLUMNS = ("task_id", "id")
CSV_IMAGE_COLUMNS = ("reference_image", "reference_png", "reference", "image")


class DatasetError(InvalidRequestError):
    """Bad input to the generator (missing file or column, bad CSV row, ...): one line, says what to fix."""


@dataclass
class Settings:
    """Everything that shapes the output; recorded in provenance.json."""

    svg_column: str = "svg"
    text_column: str = "description"
    id_column: str | None = None  # None: "id" when the shard has it
    csv_prompt_column: str | None = None  # None: the first of CSV_PROMPT_COLUMNS present
    csv_image_column: str | None = None  # None: the first of CSV_IMAGE_COLUMNS present, if any
    max_svg_bytes: int = 16_384
    max_prompt_chars: int = 1_000
    render_size: int = 256
    limit: int | None = None
    seed: int | None = None
    task_id_prefix: str = "icon"
    max_turns: int | None = None
    agent_timeout_s: float = 600.0
    verify_timeout_s: float = 120.0
    include_source_svg: bool = True


@dataclass
class Row:
    where: str  # for messages: "a.parquet row 3", "briefs.csv:4"
    text: object  # the raw description / prompt cell
    svg: object = None  # raw SVG cell (parquet) or the text of an SVG reference file (csv)
    png: bytes | None = None  # a PNG reference file's bytes (csv)
    dataset_id: str | None = None
    source: SvgTaskSource = field(default_factory=SvgTaskSource)


@dataclass
class Input:
    kind: str
    path: Path
    rows: int = 0
    rows_examined: int = 0
    columns: dict = field(default_factory=dict)
    sha256: str = ""
    bytes: int = 0

    def describe(self) -> dict:
        return {
            "kind": self.kind,
            "path": str(self.path),
            "sha256": self.sha256,
            "bytes": self.bytes,
            "rows": self.rows,
            "rows_examined": self.rows_examined,
            "columns": self.columns,
        }


def _file_digest(path: Path) -> tuple[str, int]:
    h, n = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
            n += len(chunk)
    return h.hexdigest(), n


def _open_input(kind: str, path: Path) -> Input:
    if not path.is_file():
        raise DatasetError(f"{kind} file {path} not found")
    digest, size = _file_digest(path)
    return Input(kind=kind, path=path, sha256=digest, bytes=size)


def _parquet_rows(inp: Input, settings: Settings) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(inp.path)
    except (pa.ArrowInvalid, OSError) as e:
        raise DatasetError(f"{inp.path}: not a readable parquet file: {e}") from None
    schema = pf.schema_arrow
    present = schema.names
    wanted = {"svg": (settings.svg_column, "--svg-column"), "text": (settings.text_column, "--text-column")}
    if settings.id_column is not None:
        wanted["id"] = (settings.id_column, "--id-column")
    for name, flag in wanted.values():
        if name not in present:
            raise DatasetError(f"{inp.path}: no column {name!r} ({flag}); columns present: {', '.join(present) or '(none)'}")
    id_col = settings.id_column if settings.id_column is not None else ("id" if "id" in present else None)
    for role, name in (("svg", settings.svg_column), ("text", settings.text_column)):
        t = schema.field(name).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_null(t)):
            raise DatasetError(f"{inp.path}: column {name!r} ({role}) has type {t}, expected strings")
    inp.columns = {"svg": settings.svg_column, "text": settings.text_column, "id": id_col}
    inp.rows = pf.metadata.num_rows
    columns = [settings.svg_column, settings.text_column] + ([id_col] if id_col and id_col not in (settings.svg_column, settings.text_column) else [])
    row = 0
    name = inp.path.name
    batches = pf.iter_batches(batch_size=1024, columns=columns)
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as e:
            raise DatasetError(f"{inp.path}: cannot read rows after row {row}: {e}") from None
        if batch is None:
            break
        data = batch.to_pydict()
        for i in range(batch.num_rows):
            raw_id = data[id_col][i] if id_col else None
            ds_id = None if raw_id is None else str(raw_id)
            yield Row(
                where=f"{name} row {row}",
                text=data[settings.text_column][i],
                svg=data[settings.svg_column][i],
                dataset_id=ds_id,
                source=SvgTaskSource(kind="parquet", file=name, row=row, dataset_id=ds_id),
            )
            row += 1


def _pick_column(fieldnames: list[str], explicit: str | None, candidates: tuple[str, ...], flag: str, path: Path, required: bool) -> str | None:
    if explicit is not None:
        if explicit not in fieldnames:
            raise DatasetError(f"{path}: no column {explicit!r} ({flag}); columns present: {', '.join(fieldnames) or '(none)'}")
        return explicit
    for c in candidates:
        if c in fieldnames:
            return c
    if required:
        raise DatasetError(f"{path}: no prompt column (one of {', '.join(candidates)}, or {flag}); columns present: {', '.join(fieldnames) or '(none)'}")
    return None


def _csv_rows(inp: Input, settings: Settings) -> Iterator[Row]:
    try:
        text = inp.path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{inp.path}: not UTF-8 ({e.reason} at byte {e.start})") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    fieldnames = [f.strip() for f in (reader.fieldnames or [])]
    reader.fieldnames = fieldnames
    prompt_col = _pick_column(fieldnames, settings.csv_prompt_column, CSV_PROMPT_COLUMNS, "--csv-prompt-column", inp.path, required=True)
    image_col = _pick_column(fieldnames, settings.csv_image_column, CSV_IMAGE_COLUMNS, "--csv-image-column", inp.path, required=False)
    id_col = next((c for c in CSV_ID_COLUMNS if c in fieldnames), None)
    inp.columns = {"prompt": prompt_col, "image": image_col, "id": id_col}
    base = inp.path.parent
    try:
        rows = [(reader.line_num, rec) for rec in reader]
    except csv.Error as e:
        raise DatasetError(f"{inp.path}:{reader.line_num}: bad CSV: {e}") from None
    inp.rows = len(rows)
    # Every row (and its reference file) is checked before the first is yielded, so a bad brief
    # is reported before the output directory is touched.
    out: list[Row] = []
    for lineno, rec in rows:
        where = f"{inp.path.name}:{lineno}"
        row = Row(
            where=where,
            text=rec.get(prompt_col),
            dataset_id=(rec.get(id_col) or None) if id_col else None,
            source=SvgTaskSource(kind="csv", file=inp.path.name, row=lineno),
        )
        row.source.dataset_id = row.dataset_id
        ref = (rec.get(image_col) or "").strip() if image_col else ""
        if ref:
            p = Path(ref)
            if not p.is_absolute():
                p = base / p
            if not p.is_file():
                raise DatasetError(f"{inp.path}:{lineno}: reference image {ref!r} not found (looked at {p})")
            data = p.read_bytes()
            if data.startswith(PNG_SIGNATURE):
                row.png = data
            elif p.suffix.lower() == ".svg" or b"<svg" in data[:4096]:
                try:
                    row.svg = data.decode("utf-8")
                except UnicodeDecodeError:
                    row.svg = data  # counted as malformed below
            else:
                raise DatasetError(f"{inp.path}:{lineno}: reference image {ref!r} is neither a PNG nor an SVG file")
        out.append(row)
    yield from out


def open_inputs(parquet: list[str | Path], csv_files: list[str | Path], settings: Settings) -> list[tuple[Input, Iterator[Row]]]:
    """Each input (parquet shards first, then CSV files, as given) with its rows. Every file is
    found and hashed, then every header is checked (a first row is read), before this returns."""
    inputs = [_open_input("parquet", Path(p)) for p in parquet] + [_open_input("csv", Path(p)) for p in csv_files]
    streams: list[tuple[Input, Iterator[Row]]] = []
    for inp in inputs:
        gen = _parquet_rows(inp, settings) if inp.kind == "parquet" else _csv_rows(inp, settings)
        first = next(gen, None)  # runs the header checks now
        streams.append((inp, _chain_first(first, gen)))
    return streams


def _chain_first(first: Row | None, rest: Iterator[Row]) -> Iterator[Row]:
    if first is not None:
        yield first
        yield from rest
