"""The Rollouts view's parts that need no browser: reading result files from disk, and paging the
list with the job store's cursor."""

from __future__ import annotations

import html
import json

import pytest

from harness_env.models import RolloutResult
from harness_env.server.web.rollouts import parse_result_file
from harness_env.storage import save


def test_result_file_parsing(tmp_path):
    one = RolloutResult(rollout_id="r1", task_id="t", harness="pi", reward=1.0)
    whole = tmp_path / "whole.json"
    whole.write_text(one.model_dump_json())
    compact = tmp_path / "compact.json"
    save(one, compact)
    lines = tmp_path / "many.jsonl"
    lines.write_text(one.model_dump_json() + "\n\n" + json.dumps({**one.model_dump(mode="json"), "reward": 0.5}) + "\n")
    assert [r.reward for r in parse_result_file(str(whole))] == [1.0]
    assert parse_result_file(str(compact))[0] == one
    assert [r.reward for r in parse_result_file(str(lines))] == [1.0, 0.5]
    for text, message in [
        ("", "empty"),
        ("[1, 2", "line 1 is not JSON"),
        ('{"rollout_id": "r", "harness": "pi", "reward": "x"}', "not a RolloutResult: reward"),
        ("[1]", "is not a RolloutResult"),
        (one.model_dump_json() + "\n{oops", "line 2 is not JSON"),
        ('{"a": 1}\n{"b": 2}', "line 1 is not a RolloutResult"),
    ]:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ValueError, match=message):
            parse_result_file(str(bad))
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        parse_result_file(str(binary))


async def test_the_list_pages_on_with_the_stores_cursor(tmp_path):
    """ "older" asks the job manager for the page after the cursor it gave (no query of its own)."""
    import gradio as gr

    from harness_env.models import RolloutListItem, RolloutPage
    from harness_env.server.web.rollouts import LIST_LIMIT, RolloutsView

    class Jobs:
        def __init__(self) -> None:
            self.asked: list[dict] = []

        async def list(self, **kw) -> RolloutPage:
            self.asked.append(kw)
            first = kw["before"] is None
            items = [
                RolloutListItem(rollout_id=f"{i:012x}", status="finished", created_at=1.0, harness="pi", reward=1.0, wall_s=2.0)
                for i in (range(LIST_LIMIT) if first else range(LIST_LIMIT, LIST_LIMIT + 3))
            ]
            return RolloutPage(items=items, next_cursor="77" if first else None)

    jobs = Jobs()
    with gr.Blocks():
        view = RolloutsView(jobs, str(tmp_path), [])
    rows, ids, note, cursor, older = await view.on_list(["finished"], " pi ", "")
    assert len(rows) == LIST_LIMIT and cursor == "77" and older["visible"] is True and "older" in note
    assert rows[0][1:8] == [f"{0:012x}", "finished", "pi", "-", "1.0", 2.0, "-"]
    rows, ids, note, cursor, older = await view.on_list(["finished"], " pi ", "", cursor)
    assert ids == [f"{i:012x}" for i in range(LIST_LIMIT, LIST_LIMIT + 3)] and cursor is None and older["visible"] is False
    assert [a["before"] for a in jobs.asked] == [None, 77] and jobs.asked[0]["harness"] == "pi" and jobs.asked[0]["statuses"] == ["finished"]


async def test_files_and_stored_rollouts_are_read_and_rendered_off_the_event_loop(tmp_path, monkeypatch):
    """A result can be as large as the file limit: reading and rendering it on the event loop
    stalled /health for seconds. Every heavy step runs in a worker thread."""
    import threading

    import gradio as gr

    from harness_env.models import RolloutJob
    from harness_env.server.web import rollouts

    result = RolloutResult(rollout_id="r1", task_id="t", harness="pi", reward=1.0)
    job = RolloutJob(rollout_id="r1", status="finished", created_at=1.0, harness="pi", result=result)

    class Jobs:
        store = None

        async def get(self, rollout_id, detail="summary"):
            return job

    with gr.Blocks():
        view = rollouts.RolloutsView(Jobs(), str(tmp_path), [])
    loop_thread = threading.get_ident()
    where: list[tuple[str, int]] = []
    parse, render_view = rollouts.parse_result_file, view.result.view
    monkeypatch.setattr(rollouts, "parse_result_file", lambda path: where.append(("parse", threading.get_ident())) or parse(path))
    monkeypatch.setattr(view.result, "view", lambda *a, **k: where.append(("view", threading.get_ident())) or render_view(*a, **k))
    monkeypatch.setattr(view, "_events", lambda rollout_id, after: _no_events())
    path = tmp_path / "one.json"
    save(result, path)

    opened = await view.on_file(str(path))
    assert opened[0] == {"path": str(path), "count": 1} and "one.json" in html.unescape(opened[2])
    shown = await view.open("r1")
    assert "r1" in html.unescape(shown[0])
    assert [w for w, _ in where] == ["parse", "view", "view"]
    assert all(thread != loop_thread for _, thread in where), where


async def _no_events():
    return [], -1


def test_download_files_stay_in_their_directory_and_do_not_pile_up(tmp_path):
    """Each view writes the result's JSON for its download button: a file opened again and again
    must not fill the disk, and a file's sandbox_id ("../x") names no path."""
    import gradio as gr

    from harness_env.server.web.result_area import MAX_DOWNLOADS, ResultArea

    downloads = tmp_path / "downloads"
    downloads.mkdir()
    with gr.Blocks():
        area = ResultArea(str(downloads), [])
    for n in range(MAX_DOWNLOADS + 8):
        area.view(RolloutResult(rollout_id=f"r{n}", harness="pi", reward=1.0), key=f"file-{n}")
    area.view(RolloutResult(rollout_id="x", harness="pi", reward=1.0, sandbox_id="../../escaped"))
    assert len(list(downloads.iterdir())) == MAX_DOWNLOADS
    assert sorted(p.name for p in tmp_path.iterdir()) == ["downloads"]
