"""Where this server runs: its host, and its Ray Serve replica and Ray node when it is one.

Every result names the server that ran it (RolloutResult.served_by), so a user of several replicas
sees how the load spread and where to look for a rollout's logs.
"""

from __future__ import annotations

import sys


def ray_placement() -> dict[str, str]:
    """{"replica": id, "node": id} inside a Ray Serve replica, else {}. Ray is only asked when this
    process already runs it (a replica imported it): a plain server never imports Ray."""
    if "ray.serve" not in sys.modules:
        return {}
    import ray
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        context = serve.get_replica_context()
    except RayServeException:  # Ray is imported, but this is not a replica (a driver, a test)
        return {}
    return {"replica": context.replica_id.unique_id, "node": ray.get_runtime_context().get_node_id()}
