"""Pure builder for the scrubbed environment of sandboxed commands.

Nothing is inherited from the server's environment: credentials, tokens and proxies of the host
never reach a sandbox. GPUs are hidden. The marker variable lets close() find every process of
the rollout, even one that left the process group.
"""

from __future__ import annotations

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
MARKER_VAR = "HARNESS_ENV_SANDBOX_ID"
REWARD_FILE_VAR = "HARNESS_ENV_REWARD_FILE"


def sandbox_env(*, sandbox_id: str, home: str, tmp: str, xdg_root: str, workspace: str, extra_path: list[str] | None = None) -> dict[str, str]:
    path = ":".join([*(extra_path or []), SYSTEM_PATH])
    return {
        "PATH": path,
        "HOME": home,
        "TMPDIR": tmp,
        "TMP": tmp,
        "TEMP": tmp,
        "XDG_CONFIG_HOME": f"{xdg_root}/config",
        "XDG_CACHE_HOME": f"{xdg_root}/cache",
        "XDG_DATA_HOME": f"{xdg_root}/data",
        "XDG_STATE_HOME": f"{xdg_root}/state",
        "PWD": workspace,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "HIP_VISIBLE_DEVICES": "",
        "ROCR_VISIBLE_DEVICES": "",
        "NVIDIA_VISIBLE_DEVICES": "void",
        "npm_config_update_notifier": "false",
        "npm_config_offline": "true",
        "PYTHONDONTWRITEBYTECODE": "1",
        MARKER_VAR: sandbox_id,
    }


# Keys of git's config that make git run a program, pinned for verify and setup by the
# environment (which git reads last, above every file). Belt and braces: before verify the
# repository configs themselves are reduced to keys that start nothing (gitguard.py), since no
# key disables a per-driver program (diff.<name>.command, filter.<name>.clean, ...). Every value is
# one git accepts as "none": an empty diff.external would make every `git diff` fail.
GIT_PROGRAM_KEYS = {
    "core.fsmonitor": "false",
    "core.hooksPath": "/dev/null",
    "core.pager": "cat",
    "core.editor": "true",
    "core.sshCommand": "false",
    "core.askPass": "",
    "sequence.editor": "true",
    "credential.helper": "",
    "gpg.program": "false",
    "gpg.openpgp.program": "false",
    "gpg.x509.program": "false",
    "gpg.ssh.program": "false",
    "log.showSignature": "false",
    "protocol.ext.allow": "never",
}


def git_program_pins() -> dict[str, str]:
    """GIT_CONFIG_COUNT/KEY/VALUE variables pinning GIT_PROGRAM_KEYS."""
    env = {"GIT_CONFIG_COUNT": str(len(GIT_PROGRAM_KEYS))}
    for i, (key, value) in enumerate(GIT_PROGRAM_KEYS.items()):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    return env


def verify_overrides(verify_home: str) -> dict[str, str]:
    """What verify commands get instead of the agent's home and config: a fresh HOME, XDG and
    TMPDIR, no user or system git config, git's program-running keys pinned, no user
    site-packages or startup file for Python and no bytecode it did not compile, no npm user
    config and npm's program-running settings pinned over a project's .npmrc."""
    env = {
        "HOME": verify_home,
        "TMPDIR": f"{verify_home}/tmp",
        "TMP": f"{verify_home}/tmp",
        "TEMP": f"{verify_home}/tmp",
        "XDG_CONFIG_HOME": f"{verify_home}/xdg/config",
        "XDG_CACHE_HOME": f"{verify_home}/xdg/cache",
        "XDG_DATA_HOME": f"{verify_home}/xdg/data",
        "XDG_STATE_HOME": f"{verify_home}/xdg/state",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        # Repository discovery stops below the rollout directory (a .git of its own, which plain
        # mode's agent could make, is never found from the workspace).
        "GIT_CEILING_DIRECTORIES": verify_home.rsplit("/", 1)[0],
        "GIT_TERMINAL_PROMPT": "0",
        "PYTHONNOUSERSITE": "1",
        # Bytecode only from a cache of verify's own: Python never checks an "unchecked-hash" .pyc
        # against its source, so one the agent planted in a __pycache__ would run instead of the
        # module verify wrote.
        "PYTHONPYCACHEPREFIX": f"{verify_home}/pycache",
        "NPM_CONFIG_USERCONFIG": "/dev/null",
        # npm's environment outranks a project's .npmrc: the settings that name a program it runs.
        "npm_config_script_shell": "/bin/sh",
        "npm_config_shell": "/bin/sh",
        "npm_config_node_options": "",
        **git_program_pins(),
    }
    return env
