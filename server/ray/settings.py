"""The settings of `harness-env serve --ray` (server/ray/serve.py), checked without importing Ray:
a bad flag gets its one-line error at once, before any Ray process starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness_env.server.store import STORE_URL_VAR

TOKEN_VAR = "HARNESS_ENV_TOKEN"
# The address at which sandboxes off this node (Harbor's remote providers) reach it; unset, the
# capture proxy listens on loopback only. Set per node (on Kubernetes: the pod IP).
NODE_HOST_VAR = "HARNESS_ENV_NODE_HOST"


class BadRayArgs(ValueError):
    """A Ray setting that cannot work: the message says which and what to do."""


class ReplicaSettings(BaseModel):
    """What every replica is built with (no secret: these are deployment arguments). Also the
    `args` of the RayService's serveConfigV2, which are checked against it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    public_url: str = Field(
        "http://127.0.0.1:8100", description="the application's address, where users and pages reach it (Ray Serve's proxy, or the ingress in front of it)"
    )
    token_required: bool = Field(False, description=f"refuse to start a replica whose node has no ${TOKEN_VAR}")
    max_concurrent: int | None = Field(None, ge=1, description="rollouts one replica runs at once (default: 2 x its CPUs)")
    max_queue: int | None = Field(None, ge=0, description="rollouts that may wait in one replica beyond those")
    retention_max_age: str | None = Field(None, description="as --retention-max-age")
    retention_max_size: str | None = Field(None, description="as --retention-max-size")


@dataclass(frozen=True)
class Scale:
    """How many replicas: a fixed count, or autoscaling between two bounds on ongoing requests."""

    replicas: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None

    def problem(self) -> str | None:
        bounds = (self.min_replicas, self.max_replicas)
        if self.replicas is not None and any(b is not None for b in bounds):
            return "--replicas is a fixed count: give it, or --min-replicas with --max-replicas (autoscaling), not both"
        if (self.min_replicas is None) != (self.max_replicas is None):
            return "autoscaling needs both --min-replicas and --max-replicas"
        if self.replicas is not None and self.replicas < 1:
            return "--replicas must be at least 1"
        if self.min_replicas is not None and self.max_replicas is not None:
            if self.min_replicas < 0 or self.max_replicas < 1 or self.min_replicas > self.max_replicas:
                return "--min-replicas must be at least 0 and at most --max-replicas, which must be at least 1"
        return None

    def options(self, max_concurrent: int | None) -> dict[str, Any]:
        """Ray Serve deployment options. Autoscaling aims at one replica's running slots per
        replica: a called rollout (POST /rollout, MCP run_rollout) is an ongoing request for as
        long as it runs."""
        if self.min_replicas is None or self.max_replicas is None:
            return {"num_replicas": self.replicas or 1}
        return {"autoscaling_config": {"min_replicas": self.min_replicas, "max_replicas": self.max_replicas, "target_ongoing_requests": max_concurrent or 2}}


def replica_problem(settings: ReplicaSettings, env: dict[str, str], token: str | None) -> str | None:
    """Why a replica cannot serve with this node's environment (and `token`, its node's), or None."""
    url = env.get(STORE_URL_VAR, "")
    if not url.startswith(("postgresql://", "postgresql+psycopg://")):
        return (
            f"Ray replicas share one job store: set {STORE_URL_VAR}=postgresql://USER:PASSWORD@HOST/DB in the environment of "
            "every Ray node (a SQLite store is one server's)"
        )
    if settings.token_required and not token:
        return f"the application requires a token but this Ray node has no ${TOKEN_VAR}: set it in every node's environment"
    return None


def capture_address(env: dict[str, str]) -> tuple[str, str]:
    """(address the replica's capture listener binds, host sandboxes use to reach it): loopback,
    unless the node names the address off-node sandboxes reach it at."""
    node_host = env.get(NODE_HOST_VAR, "").strip()
    return ("0.0.0.0", node_host) if node_host else ("127.0.0.1", "127.0.0.1")


def settings_from_args(args: dict[str, Any] | None) -> ReplicaSettings:
    """The RayService's serveConfigV2 `args`, checked: one error naming each bad field."""
    try:
        return ReplicaSettings.model_validate(args or {})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'args'}: {err['msg']}" for err in e.errors())
        raise BadRayArgs(f"harness-env's serveConfigV2 args: {problems} (fields: {', '.join(ReplicaSettings.model_fields)})") from None
