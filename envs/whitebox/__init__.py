"""The white-box harness: the environment owns the tool loop (bash, read, write, edit, ls, grep,
glob, submit), and the same tools as a TRL `environment_factory` environment."""

from harness_env.envs.whitebox.harness import WhiteboxHarness

__all__ = ["WhiteboxHarness"]
