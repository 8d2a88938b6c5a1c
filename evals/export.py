"""`export()`: an evaluation directory's results as a dataset, and its upload plan for the Hub.

Two tables, in JSON lines or parquet, that load with `datasets`:
  results  one row per attempt: task_id, attempt, rollout_id, harness, model, reward, passed,
           error_kind, error, mask_sample, wall_s, turns, `trajectory` (ATIF, a JSON string: the agent's own
           for Harbor rollouts, else built from the captured turns, completion ids and logprobs in
           its metrics), `tokens` (the token sidecar of evals/sidecar.py, a JSON string: per step its
           new prompt ids, completion ids, logprobs, loss mask, weight version and link; the rows
           rebuild from it) and `result` (the whole compact RolloutResult, a JSON string);
  rows     one row per branch of each attempt's turn graph, in the layout `harness-env run
           --rows-out` writes too (storage.row_records): prompt_ids, completion_ids, loss_mask and
           logprobs (aligned with completion_ids), reward, trainable, mask_sample (true: an
           infrastructure failure, never train it), stale, ...
Nested values with no fixed shape are JSON strings so that every row has the same schema.
A README.md dataset card names both tables (as `configs`), the tasks, harness, model and summary.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Literal

from harness_env.evals.atif import trajectory_of, turn_steps
from harness_env.evals.run import RESULTS, write_atomic
from harness_env.evals.sidecar import token_sidecar
from harness_env.storage import load, pack, row_records

Format = Literal["jsonl", "parquet"]
TABLES = ("results", "rows")


def attempts(out: Path):
    """(task_id, attempt, path) of every finished attempt, in task and attempt order."""
    for task_dir in sorted((out / RESULTS).iterdir()) if (out / RESULTS).is_dir() else []:
        for path in sorted(task_dir.glob("[0-9]*.json"), key=lambda p: int(p.stem)):
            yield task_dir.name, int(path.stem), path


def tables(out: Path, threshold: float, model: str) -> dict[str, list[dict[str, Any]]]:
    """The rows of both tables (see the module's docstring)."""
    results, rows = [], []
    for task_id, attempt, path in attempts(out):
        r = load(path)
        trajectory = trajectory_of(r, model)
        steps = None if r.agent_trajectory else turn_steps(trajectory)  # an agent's own steps are not our turns
        results.append(
            {
                "task_id": task_id,
                "attempt": attempt,
                "rollout_id": r.rollout_id,
                "harness": r.harness,
                "model": model,
                "reward": r.reward,
                "passed": r.reward is not None and r.reward >= threshold,
                "error_kind": r.error_kind,
                "error": r.error,
                "mask_sample": r.mask_sample,
                "wall_s": r.wall_s,
                "turns": len(r.proxy_turns),
                "trajectory": json.dumps(trajectory),
                "tokens": json.dumps(token_sidecar(r, steps), separators=(",", ":")),
                "result": json.dumps(pack(r), separators=(",", ":")),
            }
        )
        rows += row_records(r, task_id=task_id, attempt=attempt)
    return {"results": results, "rows": rows}


def _write(rows: list[dict[str, Any]], path: Path, fmt: Format) -> None:
    if fmt == "jsonl":
        write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def dataset_card(meta: dict[str, Any], summary: dict[str, Any], fmt: Format, counts: dict[str, int]) -> str:
    """README.md of the exported dataset: the tables as configs, then what was evaluated."""
    configs = "".join(f"- config_name: {t}\n  data_files: {t}.{fmt}\n" for t in TABLES)
    o = summary.get("overall", {})
    passk = ", ".join(f"pass@{k} {v:.3f}" for k, v in o.get("pass_at_k", {}).items() if v is not None)
    tasks = "\n".join(f"- `{t}`" for t in meta.get("tasks", []))
    mean = "n/a" if o.get("mean_reward") is None else f"{o['mean_reward']:.3f}" + (f" ± {o['stderr']:.3f}" if o.get("stderr") is not None else "")
    return (
        f"---\nconfigs:\n{configs}tags:\n- harness-env\n- agent-trajectories\n---\n\n"
        f"# harness-env evaluation\n\nHarness `{meta.get('harness', '')}`, model `{meta.get('model', '')}`, "
        f"{meta.get('attempts', '?')} attempts per task, pass threshold {meta.get('threshold', 1.0)}.\n\n"
        f"## Summary\n\nMean reward {mean} over {o.get('scored', 0)} scored attempts; {passk or 'no pass@k'}; "
        f"{o.get('infra_failures', 0)} infrastructure failures (no reward, `mask_sample` true) left out; errors: {json.dumps(o.get('errors', {}))}.\n\n"
        f"## Tables\n\n- `results` ({counts['results']} rows): one per attempt, with its ATIF trajectory, its token sidecar "
        f"(`tokens`: per step the new prompt ids, completion ids, logprobs, loss mask, weight version and link) and whole result "
        f"(JSON strings).\n- `rows` ({counts['rows']} rows): training rows, one per branch of a rollout's turn graph: "
        "prompt_ids, completion_ids, loss_mask and logprobs aligned with completion_ids, reward.\n\n"
        f"## Tasks ({len(meta.get('tasks', []))})\n\n{tasks}\n"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def export(out: str | Path, fmt: Format = "jsonl", dest: str | Path | None = None) -> Path:
    """Write the dataset of the evaluation in `out` to `dest` (default `out`/export); returns it."""
    if fmt not in ("jsonl", "parquet"):
        raise ValueError(f"format {fmt!r}: choose jsonl or parquet")
    out = Path(out)
    meta, summary = _read_json(out / "eval.json"), _read_json(out / "summary.json")
    if not meta:
        raise ValueError(f"{out} holds no evaluation (no eval.json): run `harness-env eval ... --out {out}` first")
    target = Path(dest) if dest is not None else out / "export"
    target.mkdir(parents=True, exist_ok=True)
    data = tables(out, float(meta.get("threshold", 1.0)), str(meta.get("model", "")))
    for name, rows in data.items():
        _write(rows, target / f"{name}.{fmt}", fmt)
    if summary:
        shutil.copyfile(out / "summary.json", target / "summary.json")
    write_atomic(target / "README.md", dataset_card(meta, summary, fmt, {k: len(v) for k, v in data.items()}))
    return target


def upload_plan(dataset_dir: str | Path, repo_id: str, *, private: bool = True) -> dict[str, Any]:
    """What `push_to_hub` uploads: the repository, its visibility and the files (the card first)."""
    root = Path(dataset_dir)
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    if "README.md" not in files:
        raise ValueError(f"{root} has no dataset card (README.md): export it first")
    files.remove("README.md")
    return {"repo_id": repo_id, "repo_type": "dataset", "private": private, "folder": str(root), "files": ["README.md", *files]}


def push_to_hub(plan: dict[str, Any], token: str | None = None) -> str:
    """Upload the plan's files with huggingface_hub (the stored token unless `token`); returns the
    dataset's URL. Creates the repository (private unless the plan says otherwise) if needed."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    url = api.create_repo(plan["repo_id"], repo_type="dataset", private=plan["private"], exist_ok=True)
    api.upload_folder(
        folder_path=plan["folder"], repo_id=plan["repo_id"], repo_type="dataset", allow_patterns=plan["files"], commit_message="harness-env export"
    )
    return str(url)
