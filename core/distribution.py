"""The installed distribution: its name and version, the one answer to "which harness-env is this"
for `--version`, the server's start line, its OpenAPI and OpenEnv metadata and dataset provenance."""

from __future__ import annotations

from importlib import metadata

DIST_NAME = "harness-env"
# A checkout that was never installed (editable or wheel): still a valid version string, as
# OpenEnv's metadata and FastAPI's OpenAPI want one.
UNINSTALLED = "0.0.0+unknown"


def package_version() -> str:
    try:
        return metadata.version(DIST_NAME)
    except metadata.PackageNotFoundError:
        return UNINSTALLED
