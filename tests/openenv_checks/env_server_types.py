"""Read a harness-env server's /health, /metadata and /schema answers with OpenEnv's own types (run in
OpenEnv's venv: tests/openenv_env.py); extra fields are refused where OpenEnv's types forbid them.

stdin: {"health": ..., "metadata": ..., "schema": ...} as the server answered. stdout: one JSON line, each as
OpenEnv parsed it ({"health_status": the HealthStatus member's name, "metadata": ..., "schema": ...}); a
document OpenEnv refuses is a non-zero exit with its ValidationError.
"""

import json
import sys

from openenv.core.env_server.types import EnvironmentMetadata, HealthStatus, SchemaResponse


def main() -> None:
    answers = json.load(sys.stdin)
    out = {
        "health_status": HealthStatus(answers["health"]["status"]).name,
        "metadata": EnvironmentMetadata.model_validate(answers["metadata"]).model_dump(mode="json"),
        "schema": SchemaResponse.model_validate(answers["schema"]).model_dump(mode="json"),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
