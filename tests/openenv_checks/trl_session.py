"""Read a loop-owning session's output with OpenEnv's harness types (run in OpenEnv's venv: tests/openenv_env.py).

stdin: {"entries": what fetch_proxy_trace() gave, "verdict": what verdict() gave}. stdout: one JSON line with
the turns of TrainingTrace.from_entries(entries) (what TRL's HarnessRolloutWorker reads), VerifyResult(**verdict)
as fields, and the members of OpenEnv's session protocols (TrainableSession, LoopOwningSession) with their
parameter names, for the session class to be held to. A document OpenEnv refuses is a non-zero exit.
"""

import dataclasses
import inspect
import json
import sys

from openenv.core.harness import LoopOwningSession, TrainableSession, TrainingTrace, VerifyResult


def _members(protocol: type) -> dict[str, list[str]]:
    """A protocol's methods and their parameters (what runtime_checkable's isinstance looks for, and more)."""
    return {name: list(inspect.signature(fn).parameters) for name, fn in vars(protocol).items() if callable(fn) and not name.startswith("_")}


def main() -> None:
    given = json.load(sys.stdin)
    trace = TrainingTrace.from_entries(given["entries"])
    verdict = VerifyResult(**given["verdict"])
    out = {
        "turns": [turn.model_dump(mode="json") for turn in trace.turns],
        "verify": dataclasses.asdict(verdict) if dataclasses.is_dataclass(verdict) else verdict.model_dump(mode="json"),
        "protocols": {p.__name__: _members(p) for p in (TrainableSession, LoopOwningSession)},
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
