"""Batch evaluation: K attempts of every task, resumable, with pass@k; and export as a dataset.

`evaluate()` is what `harness-env eval` runs; `export()` what `harness-env export` runs.
"""

from harness_env.evals.export import export
from harness_env.evals.passk import mean_and_stderr, pass_at_k
from harness_env.evals.run import evaluate
from harness_env.evals.tasks import EvalTask, load_tasks

__all__ = ["EvalTask", "evaluate", "export", "load_tasks", "mean_and_stderr", "pass_at_k"]
