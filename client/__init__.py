"""The remote client (sync and async). Imports only harness_env.models and httpx: no server code."""

from harness_env.client.http import AsyncHarnessEnv, HarnessEnv, HarnessEnvClientError

__all__ = ["AsyncHarnessEnv", "HarnessEnv", "HarnessEnvClientError"]
