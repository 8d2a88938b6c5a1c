"""`harness-env serve --ray`: the same app as a Ray Serve application, its replicas on a Ray cluster.

Each replica is a whole server: its own engine, capture proxy and sandboxes, on its node. The
harnesses a replica starts reach that replica's capture proxy on the node's loopback, through a
listener of its own that serves /capture only: capture sessions live in the replica that opened
them, so capture traffic never goes through Ray Serve's proxy and never crosses nodes. Ray Serve
routes everything else (rollouts, jobs, MCP, /web) to the replicas and scales them on ongoing
requests. The replicas share the PostgreSQL job store: a status, event stream or cancel sent to any
replica reaches the rollout wherever it runs (server/jobs/manager.py), and the rollouts of a replica that
died are marked `interrupted` by the others (server/jobs/upkeep.py).

Secrets (the token, the store URL with its password, endpoint keys) are read by each replica from
its node's environment, never passed as deployment arguments (Ray keeps those in its control store).
Kubernetes runs the same application through KubeRay: `build` is the RayService's import path
(deploy/rayservice.yaml, docs/deploy.md).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from ray import serve
from ray.serve.config import HTTPOptions
from ray.serve.schema import ProxyStatus

from harness_env.core.capture.asgi import Receive, Scope, Send, error_reply, send_reply
from harness_env.core.capture.serve import serve_on_loopback
from harness_env.core.procs import make_undumpable
from harness_env.server.app import create_app
from harness_env.server.jobs.manager import STOP_WAIT_S
from harness_env.server.jobs.upkeep import Retention
from harness_env.server.loop_lag import freeze_long_lived
from harness_env.server.placement import ray_placement
from harness_env.server.ray.settings import TOKEN_VAR, BadRayArgs, ReplicaSettings, Scale, capture_address, replica_problem, settings_from_args
from harness_env.server.routes.capture import CAPTURE_PREFIX
from harness_env.server.serve_args import where_to_go

APP_NAME = "harness-env"
DEPLOYMENT = "HarnessEnv"
REPLICA_CPUS = 1.0  # what Ray reserves per replica: with one CPU per node, one replica per node
# Ray Serve's own cap on a replica's requests in flight: far above what its slots admit
# (server/slots.py answers 429 past those), since event streams and status reads count too.
MAX_ONGOING_REQUESTS = 1000
REPLICA_HEADER = b"x-harness-env-replica"
# Ray Serve kills a proxy not ready within 3 x RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S (default 5 s)
# and starts another, each with a longer wait; `serve.start` waits 60 s at most. On a busy machine
# the first proxy is often slower: a local cluster gets a longer check, and when `serve.start`
# gives up, the command waits for a proxy to be up, this long at most.
PROXY_READY_VAR, PROXY_READY_CHECK_S = "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "30"
PROXY_START_S = 300.0
# Ray starts its workers at nice 15, and every process of a replica (Serve's controller and proxy,
# the replicas, their rollouts' sandboxes) is one: on a machine busy with anything else they get a
# few percent of the CPU (CI saw Ray Serve take minutes to start). A local cluster's run at 0.
NICENESS_VAR, NICENESS = "RAY_worker_niceness", "0"


class CaptureOnly:
    """The replica's capture listener: the app's /capture routes, nothing of its API (the app is
    set once built, after the listener's port is known)."""

    def __init__(self) -> None:
        self.app: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return  # no websocket or lifespan here: the app's lifespan is Ray Serve's to run
        if self.app is None or not scope.get("path", "").startswith(CAPTURE_PREFIX + "/"):
            await send_reply(send, error_reply(404, f"only the capture proxy ({CAPTURE_PREFIX}/v1) is served here", "not_found"))
            return
        await self.app(scope, receive, send)


def naming_replica(app: Any, replica: str) -> Any:
    """`app`, its every HTTP answer naming the replica that gave it (REPLICA_HEADER): which
    replica answered a status or a cancel, where to look for its logs."""
    name = (REPLICA_HEADER, replica.encode())

    async def named(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_named(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), name]}
            await send(message)

        await app(scope, receive, send_named)

    return named


class HarnessEnvReplica:
    """One replica: builds the app (server/app.py) in the replica, after its capture listener."""

    async def __init__(self, settings: ReplicaSettings) -> None:
        self.settings = settings
        self._exit = contextlib.AsyncExitStack()

    async def __serve_build_asgi_app__(self) -> Any:
        env = dict(os.environ)
        problem = replica_problem(self.settings, env, env.get(TOKEN_VAR))
        if problem:
            raise BadRayArgs(problem)
        # What a replica killed on this node (SIGKILL, out of memory) left (rollouts, mounts,
        # cgroups, its capture socket) is swept by the app's lifespan, which Ray Serve runs.
        bind, reach = capture_address(env)
        capture = CaptureOnly()
        port = urlsplit(await self._exit.enter_async_context(serve_on_loopback(capture, bind))).port
        s = self.settings
        app = create_app(
            public_url=s.public_url,
            capture_url=f"http://{reach}:{port}",
            token=env.get(TOKEN_VAR) or None,
            max_concurrent=s.max_concurrent,
            max_queue=s.max_queue,
            retention=Retention.from_env(s.retention_max_age, s.retention_max_size),
        )
        capture.app = app
        make_undumpable()  # as `harness-env serve`: the token and keys out of reach of the plain sandbox's uid
        freeze_long_lived()
        return naming_replica(app, ray_placement().get("replica", ""))

    async def __del__(self) -> None:
        # Runs after the app's lifespan ended (its jobs interrupted and cleaned up, the proxy
        # still serving them meanwhile): then the capture listener goes.
        await self._exit.aclose()


def application(settings: ReplicaSettings, scale: Scale, replica_cpus: float = REPLICA_CPUS) -> Any:
    """The Ray Serve application: `scale` replicas of HarnessEnvReplica."""
    problem = scale.problem()
    if problem:
        raise BadRayArgs(problem)
    deployment = serve.deployment(
        name=DEPLOYMENT,
        ray_actor_options={"num_cpus": replica_cpus},
        max_ongoing_requests=MAX_ONGOING_REQUESTS,
        graceful_shutdown_timeout_s=STOP_WAIT_S + 10,  # a stopping replica's jobs end `interrupted`, cleaned up
        **scale.options(settings.max_concurrent),
    )(serve.ingress()(HarnessEnvReplica))
    return deployment.bind(settings)


def build(args: dict[str, Any]) -> Any:
    """The RayService's application builder (serveConfigV2 `import_path:
    harness_env.server.ray.serve:build`, its `args` a ReplicaSettings); the replica counts are the
    serveConfigV2 deployment's own (num_replicas or autoscaling_config)."""
    return application(settings_from_args(args), Scale(replicas=1))


def stop_on_signal() -> threading.Event:
    """An event set by SIGINT or SIGTERM. Installed right after ray.init, which puts its own
    handlers there (a SIGTERM would otherwise abort the process and leave a local cluster's
    processes running)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def start_serve(host: str, port: int, stop: threading.Event, timeout_s: float = PROXY_START_S) -> None:
    """serve.start with one HTTP proxy on the head node, waiting for it. A proxy slow to start makes
    serve.start fail (Ray Serve's controller killed it and starts another, or it was not ready within
    serve.start's own 60 s): then wait for a proxy to be up."""
    import ray

    options = HTTPOptions(host=host, port=port)
    try:
        serve.start(proxy_location="HeadOnly", http_options=options)
        return
    except (ray.exceptions.RayActorError, TimeoutError):  # killed while starting; or not ready in serve.start's 60 s
        print(f"harness-env: Ray Serve's HTTP proxy is slow to start; waiting for it (or its replacement) up to {timeout_s:.0f}s", file=sys.stderr, flush=True)
    serve.start(proxy_location="HeadOnly", http_options=options)  # the controller runs: this connects to it
    deadline = time.monotonic() + timeout_s
    while ProxyStatus.HEALTHY not in serve.status().proxies.values():
        if time.monotonic() > deadline:
            raise RuntimeError(f"Ray Serve's HTTP proxy did not start in {timeout_s:.0f}s (see Ray's logs)")
        if stop.wait(0.5):
            return


def serve_on_ray(*, host: str, port: int, address: str | None, scale: Scale, settings: ReplicaSettings, token: str | None) -> int:
    """Deploy the application on the Ray cluster at `address` (None: start a local one), Ray
    Serve's HTTP proxy on host:port (the head node), until SIGINT/SIGTERM; then remove it (and stop
    the local cluster). Returns the exit code."""
    import ray

    problem = scale.problem() or (replica_problem(settings, dict(os.environ), token) if address is None else None)
    if problem:
        print(f"harness-env: error: {problem}", file=sys.stderr)
        return 2
    if address is None and token:
        os.environ[TOKEN_VAR] = token  # the local nodes inherit this process's environment
    if address is None:
        os.environ.setdefault(PROXY_READY_VAR, PROXY_READY_CHECK_S)  # the local nodes inherit this too
        os.environ.setdefault(NICENESS_VAR, NICENESS)
        # Small and quiet: no dashboard; the object store holds nothing of ours (requests are small).
        # On loopback: a one-machine cluster has no business on the host's network address.
        ray.init(address="local", include_dashboard=False, object_store_memory=100 * 1024 * 1024, log_to_driver=False, _node_ip_address="127.0.0.1")
    else:
        ray.init(address=address, log_to_driver=False)
    stop = stop_on_signal()
    try:
        # One proxy, on the head node: the port is this command's (a cluster that runs Serve
        # already keeps its own proxies).
        start_serve(host, port, stop)
        if stop.is_set():  # asked to stop while Serve started: nothing to deploy
            return 0
        serve.run(application(settings, scale), name=APP_NAME, route_prefix="/", blocking=False)
        print(where_to_go(host, port, settings.public_url), file=sys.stderr, flush=True)
        while not stop.wait(1.0):  # a stop asked for while deploying is seen here too
            pass
    except BadRayArgs as e:
        print(f"harness-env: error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # Ray Serve gave up deploying: a replica could not start (its reason first)
        print(f"harness-env: error: the application did not start on Ray: {str(e).strip()[:2000]}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(Exception):  # stopping anyway: what failed is in Ray's own logs
            if address is None:
                serve.shutdown()
            else:
                serve.delete(APP_NAME)  # other applications on that cluster go on
        ray.shutdown()
    return 0
