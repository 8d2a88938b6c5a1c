"""The rows TRL's AsyncGRPO harness worker makes of a session's trace (run by tests/openenv_env.check_beside_trl:
TRL from the project's venv, OpenEnv's TrainingTrace from OpenEnv's own).

stdin: {"entries": what fetch_proxy_trace() gave, "episode_id"}. stdout: one JSON line, {"rows": [{"input_ids",
"completion_mask"}, ...]}, one per sequence TRL's worker chains the trace's turns into.
"""

import json
import os
import sys

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from openenv.core.harness import TrainingTrace  # noqa: E402
from trl.experimental.async_grpo.openenv_harness import _chain_to_sequences, _turns_from_training_trace  # noqa: E402


def main() -> None:
    given = json.load(sys.stdin)
    trace = TrainingTrace.from_entries(given["entries"])
    sequences, _ = _chain_to_sequences(_turns_from_training_trace(trace), given["episode_id"], 0)
    print(json.dumps({"rows": [{"input_ids": list(s.input_ids), "completion_mask": list(s.completion_mask)} for s in sequences]}))


if __name__ == "__main__":
    main()
