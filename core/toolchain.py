"""Pinned harness CLIs and the Node runtime, installed from the npm registry into a project-owned
tools directory (never global npm).

Each harness declares its own pin (`pin` on its class); `pins()` gathers them from the harness
registry, the single source of truth for versions: the install command, the tests and the
Dockerfile all read it (`harness-env install --print-pins` prints it as JSON).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

from harness_env.core.errors import ToolMissingError
from harness_env.core.registry import HARNESSES

NODE_VERSION = "22.23.5"  # installed only when the machine's Node is older than a pin needs


@dataclass(frozen=True)
class ToolPin:
    name: str
    package: str
    version: str
    bin: str  # the package.json "bin" entry to run (Node CLIs), or the native binary's name
    node_min: str | None = None  # a Node CLI: the Node it needs; None: a native binary
    native_prefix: str | None = None  # native: the platform packages are <prefix>-linux-<arch>[-variant]
    native_path: str = "bin/{bin}"  # native: the binary inside its platform package ({machine}: x86_64, aarch64)
    native_variants: bool = True  # native: musl and baseline (no AVX2) builds are packages of their own


def pins() -> dict[str, ToolPin]:
    """Each registered harness's pin, by harness name: a harness whose CLI comes from npm declares
    it (`pin` on its class, in its own package under envs/); this module only installs and finds it."""
    return {name: cls.pin for name, cls in HARNESSES.items() if cls.pin is not None}


def pin_of(name: str) -> ToolPin:
    cls = HARNESSES.get(name)  # one harness's pin: not every harness's gathered first
    pin = cls.pin if cls is not None else None
    if pin is None:
        raise ToolMissingError(f"no harness {name!r} with a pinned CLI is registered; known: {', '.join(pins())}")
    return pin


def tools_dir() -> Path:
    env = os.environ.get("HARNESS_ENV_TOOLS_DIR")
    if env:
        return Path(env)
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "harness-env" / "tools"


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.strip().lstrip("v").split("-")[0].split(".") if p.isdigit())


def node_package() -> str:
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine().lower())
    if arch is None:
        raise ToolMissingError(f"no Node package for this machine ({platform.machine()}); install Node >= 22 yourself")
    return f"node-linux-{arch}"


def _system_node() -> tuple[str, str] | None:
    path = shutil.which("node")
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path, out.strip()


def _installed_node(root: Path) -> str | None:
    binary = root / "node" / "node_modules" / node_package() / "bin" / "node"
    return str(binary) if binary.exists() else None


def node_binary(min_version: str, root: Path | None = None) -> str:
    """A Node executable new enough for `min_version`: ours if installed, else the machine's."""
    root = root or tools_dir()
    ours = _installed_node(root)
    if ours:
        return ours
    system = _system_node()
    if system and _version_tuple(system[1]) >= _version_tuple(min_version):
        return system[0]
    raise ToolMissingError(f"Node >= {min_version} is needed but not installed (machine has {system[1] if system else 'none'}); run `harness-env install`")


def _package_dir(root: Path, pin: ToolPin) -> Path:
    return root / pin.name / "node_modules" / pin.package


def _pin(tool: str | ToolPin) -> ToolPin:
    """A harness's own pin as it is (an instance need not be registered), or a registered one by name."""
    return tool if isinstance(tool, ToolPin) else pin_of(tool)


def installed_version(tool: str | ToolPin, root: Path | None = None) -> str | None:
    pin = _pin(tool)
    manifest = _package_dir(root or tools_dir(), pin) / "package.json"
    try:
        return json.loads(manifest.read_text())["version"]
    except (OSError, ValueError, KeyError):
        return None


def harness_command(tool: str | ToolPin, root: Path | None = None) -> list[str]:
    """argv prefix that runs the pinned CLI `tool` (Node + its entry script)."""
    root = root or tools_dir()
    pin = _pin(tool)
    version = installed_version(pin, root)
    if version != pin.version:
        have = f"version {version} is installed" if version else "it is not installed"
        raise ToolMissingError(f"{pin.name} {pin.version} is needed but {have}; run `harness-env install {pin.name}`")
    if pin.native_prefix:
        return [native_binary(pin, root)]
    pkg_dir = _package_dir(root, pin)
    manifest = json.loads((pkg_dir / "package.json").read_text())
    bins = manifest.get("bin")
    entry = bins.get(pin.bin) if isinstance(bins, dict) else bins
    if not entry:
        raise ToolMissingError(f"{pin.package} has no '{pin.bin}' executable; reinstall with `harness-env install {pin.name}`")
    return [node_binary(pin.node_min or "0", root), str((pkg_dir / entry).resolve())]


def _cpu_has_avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def native_binary(pin: ToolPin, root: Path) -> str:
    """The platform binary npm installed as an optional dependency. Found here rather than by the
    package's postinstall script, which `install` never runs: the same choice it would make
    (musl or glibc, baseline build without AVX2)."""
    arch = node_package().removeprefix("node-linux-")
    base = f"{pin.native_prefix}-linux-{arch}"
    variants = [base]
    if pin.native_variants:
        musl = any(Path("/lib").glob("ld-musl-*"))
        variants = [base + ("-musl" if musl else "")]
        if arch == "x64":
            baseline = base + "-baseline" + ("-musl" if musl else "")
            variants = variants + [baseline] if _cpu_has_avx2() else [baseline, *variants]
    inside = pin.native_path.format(bin=pin.bin, machine={"x64": "x86_64", "arm64": "aarch64"}[arch])
    modules = root / pin.name / "node_modules"
    for variant in variants:
        binary = modules / variant / inside
        if binary.exists():
            return str(binary)
    raise ToolMissingError(f"{pin.package}'s binary for this platform ({', '.join(variants)}) is missing; run `harness-env install {pin.name}`")


def _npm(args: list[str]) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise ToolMissingError("npm is needed to install harness CLIs; install Node.js and npm (apt-get install nodejs npm)")
    env = {**os.environ, "npm_config_update_notifier": "false", "npm_config_fund": "false", "npm_config_audit": "false"}
    proc = subprocess.run([npm, *args], capture_output=True, text=True, env=env, timeout=1800)
    if proc.returncode != 0:
        raise ToolMissingError(f"`npm {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")


def install(names: list[str] | None = None, root: Path | None = None, log=print) -> dict[str, str]:
    """Install the pinned CLIs (all by default) and Node if needed. Idempotent; returns name -> version."""
    root = root or tools_dir()
    known = pins()
    names = names or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ToolMissingError(f"unknown harness {', '.join(unknown)}; known: {', '.join(known)}")
    done: dict[str, str] = {}
    need_node = max((_version_tuple(known[n].node_min or "0") for n in names), default=())
    system = _system_node()
    if not _installed_node(root) and (system is None or _version_tuple(system[1]) < need_node):
        log(f"installing Node {NODE_VERSION} into {root / 'node'} (machine has {system[1] if system else 'none'})")
        _npm(["install", "--prefix", str(root / "node"), "--no-save", f"{node_package()}@{NODE_VERSION}"])
        done["node"] = NODE_VERSION
    for name in names:
        pin = known[name]
        if installed_version(pin, root) == pin.version:
            log(f"{name} {pin.version} already installed")
            done[name] = pin.version
            continue
        log(f"installing {pin.package}@{pin.version} into {root / name}")
        target = root / name
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True, exist_ok=True)
        # Lifecycle scripts are not needed by these CLIs and may fetch from the internet.
        _npm(["install", "--prefix", str(target), "--no-save", "--ignore-scripts", "--omit=dev", f"{pin.package}@{pin.version}"])
        if installed_version(pin, root) != pin.version:
            raise ToolMissingError(f"{pin.package}@{pin.version} did not install into {target}")
        harness_command(name, root)  # the executable is really there (a native binary, say)
        done[name] = pin.version
    return done


def pins_json() -> str:
    return json.dumps({"node": NODE_VERSION, **{n: asdict(p) for n, p in pins().items()}}, indent=2)
