"""Batch evaluation: K attempts of every task, resumable, with pass@k; and export as a dataset.

`evaluate()` is what `harness-env eval` runs; `export()` what `harness-env export` runs. From code:

    tasks = load_tasks("tasks.jsonl")
    base = {"harness": "pi", "endpoint": {"base_url": "http://127.0.0.1:8000/v1", "model": "Qwen/Qwen3-8B"}}
    summary = evaluate([(t.task_id, task_request(t, base)) for t in tasks], "runs/pi", attempts=8, concurrency=16)

A trainer reads an export's training rows back with `rows_from_export(results_row)` (evals/sidecar.py).
"""

from harness_env.evals.export import export
from harness_env.evals.passk import mean_and_stderr, pass_at_k
from harness_env.evals.run import evaluate
from harness_env.evals.sidecar import rows_from_export
from harness_env.evals.tasks import EvalTask, load_tasks, task_request

__all__ = ["EvalTask", "evaluate", "export", "load_tasks", "mean_and_stderr", "pass_at_k", "rows_from_export", "task_request"]
