"""The SVG icon dataset generator: filters, provenance, references, CSV briefs, CLI errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness_env.families.svg_icon import checks, dataset
from harness_env.families.svg_icon.dataset import DatasetError, Settings, generate, main
from harness_env.families.svg_icon.pngcodec import PNG_SIGNATURE, encode_png
from harness_env.families.svg_icon.records import RecordsError, load_records

NS = 'xmlns="http://www.w3.org/2000/svg"'
CIRCLE = f'<svg {NS} viewBox="0 0 24 24"><circle cx="12" cy="12" r="8" fill="#c00"/></svg>'
SQUARE = f'<svg {NS} viewBox="0 0 24 24"><rect x="4" y="4" width="16" height="16" fill="#00c"/></svg>'
STAR = f'<svg {NS} viewBox="0 0 24 24"><path d="M12 2 15 9 22 9 16 14 18 21 12 17 6 21 8 14 2 9 9 9Z" fill="gold" stroke="#000"/></svg>'
BLANK = f'<svg {NS} viewBox="0 0 24 24"><rect width="24" height="24" fill="#fff"/></svg>'
# The same drawing as CIRCLE, spelled differently (attribute order, whitespace): a duplicate.
CIRCLE_AGAIN = f'<svg viewBox="0 0 24 24" {NS}>\n  <circle fill="#c00" r="8" cy="12" cx="12" />\n</svg>'
LONG = f'<svg {NS} viewBox="0 0 24 24">' + '<path d="M1 1L2 2" stroke="#000"/>' * 200 + "</svg>"

ROWS = [  # (id, svg, description)
    ("a1", CIRCLE, "A red circle."),
    ("a2", "<svg><circle></svg>", "Broken markup."),
    ("a3", LONG, "Many tiny lines."),
    ("a4", BLANK, "A white square on white."),
    ("a5", CIRCLE_AGAIN, "Another red circle."),
    ("a6", SQUARE, "  A   blue\n square. "),
    ("a7", STAR, "   "),
    ("a8", f'<!DOCTYPE svg [<!ENTITY x "y">]><svg {NS}><text>&x;</text></svg>', "Entity."),
    ("a9", f"<html {NS}/>", "Not an svg root."),
    ("a10", STAR, "a red CIRCLE"),  # same prompt as a1, different drawing
    ("a11", STAR, "A golden star"),
    ("a12", None, "No svg at all."),
]


def write_parquet(path: Path, rows=ROWS, names=("id", "svg", "description")) -> Path:
    cols = list(zip(*rows))
    pq.write_table(pa.table({n: pa.array(list(c), type=pa.string()) for n, c in zip(names, cols)}), path)
    return path


def assert_png(path: Path, size: int = 256) -> None:
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE), path
    w, h = struct.unpack(">II", data[16:24])
    assert (w, h) == (size, size)


def solid_png(path: Path, rgb=(255, 255, 255), size=8, dot=False) -> Path:
    px = b"".join(bytes((0, 0, 0) if dot and x < size // 2 else rgb) for _ in range(size) for x in range(size))
    path.write_bytes(encode_png(size, size, px))
    return path


def test_parquet_filters_and_provenance(tmp_path):
    shard = write_parquet(tmp_path / "icons.parquet")
    out = tmp_path / "out"
    report = generate(out, parquet=[shard], settings=Settings(max_svg_bytes=2000, max_turns=5))

    records = load_records(out / "tasks.jsonl")
    assert [r.task_id for r in records] == ["icon-a1", "icon-a6", "icon-a11"]
    assert [r.prompt for r in records] == ["A red circle.", "A blue square.", "A golden star"]
    assert records[1].source_prompt == "  A   blue\n square. "
    assert records[0].source_svg == CIRCLE and records[0].max_turns == 5
    assert records[0].source.model_dump() == {"kind": "parquet", "file": "icons.parquet", "row": 0, "dataset_id": "a1"}
    for r in records:  # load_records resolves the relative path against the JSONL's directory
        assert Path(r.reference_png) == (out / "refs" / f"{r.task_id}.png").resolve()
        assert_png(Path(r.reference_png))
    raw = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert raw[0]["reference_png"] == "refs/icon-a1.png"
    assert sorted(p.name for p in (out / "refs").iterdir()) == ["icon-a1.png", "icon-a11.png", "icon-a6.png"]

    prov = json.loads((out / "provenance.json").read_text())
    assert prov == report.provenance
    assert prov["counts"] == {
        "rows_total": 12,
        "examined": 12,
        "kept": 3,
        "filtered": {"empty_prompt": 1, "too_long": 1, "malformed": 4, "duplicate_svg": 1, "duplicate_prompt": 1, "blank": 1},
    }
    (inp,) = prov["inputs"]
    assert inp["rows"] == 12 and inp["kind"] == "parquet" and len(inp["sha256"]) == 64
    assert inp["columns"] == {"svg": "svg", "text": "description", "id": "id"}
    assert prov["settings"]["max_svg_bytes"] == 2000 and prov["tool"]["version"]
    assert any("icons.parquet row 4" in e and "icons.parquet row 0" in e for e in prov["examples"]["duplicate_svg"])
    assert any("DOCTYPE" in e for e in prov["examples"]["malformed"])
    assert "kept 3 of 12" in report.summary()


def test_limit_seed_and_custom_columns_across_shards(tmp_path):
    a = write_parquet(tmp_path / "a.parquet", ROWS[:6], names=("uid", "svg_code", "caption"))
    b = write_parquet(tmp_path / "b.parquet", ROWS[6:], names=("uid", "svg_code", "caption"))
    s = Settings(svg_column="svg_code", text_column="caption", id_column="uid", max_svg_bytes=2000, limit=2)
    report = generate(tmp_path / "o1", parquet=[a, b], settings=s)
    assert [r.task_id for r in report.records] == ["icon-a1", "icon-a6"]
    assert report.provenance["stopped_at_limit"] is True
    assert [i["rows_examined"] for i in report.provenance["inputs"]] == [6, 0]

    s.limit, s.seed = None, 7
    r1 = generate(tmp_path / "o2", parquet=[a, b], settings=s)
    r2 = generate(tmp_path / "o3", parquet=[a, b], settings=s)
    assert [r.task_id for r in r1.records] == [r.task_id for r in r2.records]
    assert len(r1.records) == 3 and r1.provenance["counts"]["examined"] == 12


def test_missing_column_lists_the_columns_present(tmp_path):
    shard = write_parquet(tmp_path / "icons.parquet", names=("id", "svg_code", "description"))
    with pytest.raises(DatasetError, match=r"no column 'svg' \(--svg-column\); columns present: id, svg_code, description"):
        generate(tmp_path / "out", parquet=[shard])
    assert not (tmp_path / "out").exists()  # nothing written for bad input


def test_csv_briefs_with_and_without_reference_images(tmp_path):
    refs = tmp_path / "briefs" / "img"
    refs.mkdir(parents=True)
    (refs / "sun.svg").write_text(STAR)
    solid_png(refs / "dot.png", dot=True)
    solid_png(refs / "white.png")
    briefs = tmp_path / "briefs" / "briefs.csv"
    briefs.write_text(
        "task_id,prompt,reference_image\n"
        "sun,A yellow star with a black outline,img/sun.svg\n"
        "dot,Half black half white,img/dot.png\n"
        ",A house with a red roof,\n"
        "white,Nothing at all,img/white.png\n"
        "again,a house with a red roof.,\n"
        "empty,,\n"
    )
    out = tmp_path / "out"
    report = generate(out, csv_files=[briefs])
    recs = {r.task_id: r for r in load_records(out / "tasks.jsonl")}
    house = next(k for k in recs if k.startswith("brief-"))
    assert set(recs) == {"sun", "dot", house}
    assert recs[house].reference_png is None and recs[house].source.row == 4
    assert_png(Path(recs["sun"].reference_png))
    assert Path(recs["dot"].reference_png).read_bytes() == (refs / "dot.png").read_bytes()
    assert report.provenance["counts"]["filtered"] == {"empty_prompt": 1, "too_long": 0, "malformed": 0, "duplicate_svg": 0, "duplicate_prompt": 1, "blank": 1}
    assert report.provenance["inputs"][0]["columns"] == {"prompt": "prompt", "image": "reference_image", "id": "task_id"}

    plain = tmp_path / "plain.csv"
    plain.write_text("description\nA cat\nA dog\n")
    report = generate(tmp_path / "out2", csv_files=[plain])
    assert [r.prompt for r in report.records] == ["A cat", "A dog"]
    assert all(r.reference_png is None for r in report.records)

    bad = tmp_path / "bad.csv"
    bad.write_text("prompt,image\nA cat,missing.png\n")
    with pytest.raises(DatasetError, match=r"bad.csv:2: reference image 'missing.png' not found"):
        generate(tmp_path / "out3", csv_files=[bad])


def test_renderer_is_pluggable(tmp_path):
    shard = write_parquet(tmp_path / "icons.parquet", ROWS[:1])
    calls = []

    def renderer(svg, w, h):
        calls.append((w, h))
        return dataset.render_with_resvg(svg, w, h)

    generate(tmp_path / "out", parquet=[shard], settings=Settings(render_size=64), renderer=renderer)
    assert calls == [(64, 64)]
    assert_png(tmp_path / "out" / "refs" / "icon-a1.png", 64)


def test_existing_output_needs_overwrite(tmp_path):
    shard = write_parquet(tmp_path / "icons.parquet", ROWS[:1])
    generate(tmp_path / "out", parquet=[shard])
    with pytest.raises(DatasetError, match="--overwrite"):
        generate(tmp_path / "out", parquet=[shard])
    generate(tmp_path / "out", parquet=[shard], overwrite=True)


def test_blank_check_on_resvg_output():
    assert checks.is_blank(dataset.render_with_resvg(BLANK, 256, 256))
    assert not checks.is_blank(dataset.render_with_resvg(STAR, 256, 256))
    thin = f'<svg {NS} viewBox="0 0 24 24"><path d="M2 12H22" stroke="#000" stroke-width="0.5"/></svg>'
    assert not checks.is_blank(dataset.render_with_resvg(thin, 256, 256))


def test_cli(tmp_path, capsys):
    shard = write_parquet(tmp_path / "icons.parquet")
    assert main(["--parquet", str(shard), "--out", str(tmp_path / "out"), "--max-svg-bytes", "2000"]) == 0
    assert "kept 3 of 12" in capsys.readouterr().out

    bad_inputs = [
        ["--parquet", str(shard), "--out", str(tmp_path / "o"), "--svg-column", "nope"],
        ["--parquet", str(tmp_path / "missing.parquet"), "--out", str(tmp_path / "o")],
        ["--out", str(tmp_path / "o")],
        ["--parquet", str(shard), "--out", str(tmp_path / "o"), "--limit", "0"],
        ["--parquet", str(shard)],
    ]
    for argv in bad_inputs:
        with pytest.raises(SystemExit) as e:
            code = main(argv)
            raise SystemExit(code)
        assert e.value.code == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "error:" in err, (argv, err)
    main(["--parquet", str(shard), "--out", str(tmp_path / "o"), "--svg-column", "nope"])
    assert "columns present: id, svg, description" in capsys.readouterr().err


def test_load_records_reports_every_bad_line(tmp_path):
    f = tmp_path / "tasks.jsonl"
    f.write_text(
        '{"task_id": "ok", "prompt": "a cat"}\n'
        "not json\n"
        "\n"
        '{"task_id": "x", "prompt": ""}\n'
        '{"task_id": "ok", "prompt": "a dog"}\n'
        '{"task_id": "y", "prompt": "a cow", "reference_png": "refs/y.png"}\n'
        "[1]\n"
    )
    with pytest.raises(RecordsError) as e:
        load_records(f)
    problems = e.value.problems
    assert [p.split(": ")[0] for p in problems] == [f"{f}:{n}" for n in (2, 4, 5, 6, 7)]
    assert "already used on line 1" in problems[2] and "not found" in problems[3]
