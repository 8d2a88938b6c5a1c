"""The routes by which OpenEnv's tools see an environment: GET /health, /metadata and /schema.

`openenv validate --url` (openenv 0.10) checks that /health says `"status": "healthy"`, that
/metadata names the environment and describes it, and that /schema carries the action, observation
and state JSON schemas; the shapes follow OpenEnv's own HTTP server (its EnvironmentMetadata and
SchemaResponse, restated here because openenv is not a dependency of the server). harness-env is
stateless, "production mode" in OpenEnv's terms: one action (a rollout's arguments) gives one
observation (its result), and there is no /reset, /step or /state (the validator requires that too).
The schema's `state` is the server's own state, which /health reports.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from importlib import metadata
from typing import Literal

from fastapi import FastAPI
from pydantic import BaseModel, Field

from harness_env.core.distribution import DIST_NAME, package_version
from harness_env.models import RolloutArgs, RolloutResult

# Also openenv.yaml's `description` (a test holds them equal).
DESCRIPTION = (
    "Runs real coding-agent harnesses (Pi, OpenCode, Harbor's agents, a white-box tool loop) on tasks in "
    "sandboxes against any OpenAI-compatible policy endpoint, and returns the reward plus the exact token "
    "ids and logprobs of every model call."
)


class ServerState(BaseModel):
    """What the server is doing: its harnesses, its sandbox backend, and its rollout slots."""

    harnesses: dict[str, str | None] = Field(description="harness name -> installed version (null: not installed)")
    sandbox_backend: str = Field(description="the local backend's bwrap (OS-level sandboxes) or plain (directories only); else the backend the server was told")
    rollouts_running: int = Field(ge=0)
    rollouts_queued: int = Field(ge=0)
    max_concurrent: int = Field(ge=1, description="rollouts run at once")
    max_queue: int = Field(ge=0, description="rollouts that may wait for a slot; more are refused with 429")


class Health(ServerState):
    status: Literal["healthy"] = "healthy"  # OpenEnv's HealthStatus.HEALTHY: a server that answers is healthy


class EnvironmentMetadata(BaseModel):
    """OpenEnv's EnvironmentMetadata, field for field."""

    name: str
    description: str
    readme_content: str | None = None
    version: str | None = None
    author: str | None = None
    documentation_url: str | None = None


class SchemaResponse(BaseModel):
    """OpenEnv's SchemaResponse: the JSON schemas of what the environment takes and gives."""

    action: dict = Field(description="the arguments of a rollout (POST /rollout, MCP run_rollout)")
    observation: dict = Field(description="the result of a rollout")
    state: dict = Field(description="the server's state, as /health reports it")


@cache
def environment_metadata() -> EnvironmentMetadata:
    """From the installed distribution's metadata (editable or wheel alike), so the README comes
    along without the package shipping README.md as a data file."""
    try:
        meta = metadata.metadata(DIST_NAME)
    except metadata.PackageNotFoundError:
        return EnvironmentMetadata(name=DIST_NAME, description=DESCRIPTION, version=package_version())
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [] if ", " in u)
    docs = next((urls[k] for k in ("Documentation", "Homepage", "Repository", "Source") if k in urls), None)
    return EnvironmentMetadata(
        name=DIST_NAME,
        description=DESCRIPTION,
        readme_content=meta.get_payload() or None,  # type: ignore[attr-defined]
        version=package_version(),
        author=meta.get("Author") or meta.get("Author-email"),
        documentation_url=docs,
    )


@cache
def schemas() -> SchemaResponse:
    return SchemaResponse(
        action=RolloutArgs.model_json_schema(),
        observation=RolloutResult.model_json_schema(mode="serialization"),
        state=ServerState.model_json_schema(mode="serialization"),
    )


def add_openenv_routes(app: FastAPI, state: Callable[[], ServerState]) -> None:
    """/health, /metadata and /schema on `app`; `state` reads the server's state at each call."""

    @app.get("/health", response_model=Health, tags=["Environment Info"], summary="Liveness and load")
    async def health() -> Health:
        """Always `healthy` when it answers (open without a token), with what the server runs."""
        return Health(**state().model_dump())

    @app.get("/metadata", response_model=EnvironmentMetadata, tags=["Environment Info"], summary="What this environment is")
    async def get_metadata() -> EnvironmentMetadata:
        return environment_metadata()

    @app.get("/schema", response_model=SchemaResponse, tags=["Schema"], summary="JSON schemas of action, observation, state")
    async def get_schema() -> SchemaResponse:
        """action: a rollout's arguments; observation: its result; state: the server's state."""
        return schemas()
