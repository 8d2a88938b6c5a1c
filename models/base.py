"""Wire types, part 1: the bounds every request obeys, the checks behind them, and the task and
endpoint of a rollout. Import them from `harness_env.models`.

Every size and count has a bound so that a bad request fails validation with a clear message
instead of exhausting the server; every string must be valid Unicode and every free-form value
shallow enough to copy and serialise.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, StringConstraints, ValidationInfo, field_validator

MAX_INSTRUCTION_CHARS = 200_000
MAX_COMMANDS = 64
MAX_COMMAND_CHARS = 20_000
MAX_FILES = 256
MAX_FILE_CHARS = 2_000_000
MAX_TOTAL_FILE_CHARS = 16_000_000
MAX_PATH_CHARS = 512
MAX_NAME_BYTES = 255  # one path component: what Linux file systems allow
MAX_NESTING = 32  # levels of lists and objects in free-form values (harness_config, ...)
MAX_IMAGE_CHARS = 1024
# skopeo's transports that name a file on the server's disk (the rest are registry references)
LOCAL_IMAGE_TRANSPORTS = ("oci:", "oci-archive:", "docker-archive:")
IMAGE_DESCRIPTION = (
    "the task's container image, the root of setup, agent and verify (local sandbox, bubblewrap): a registry "
    "reference (a registry on loopback over plain HTTP) or, for callers on the server's machine only (CLI, in-process), "
    "oci:PATH:TAG, oci-archive:PATH, docker-archive:PATH"
)

Mode = Literal["transparent_proxy", "black_box"]
# The name of an API an endpoint speaks: "chat", or a registered dialect's own API (its NativeAPI's
# wire_api). Open: a dialect from another package brings its own name. Only the form is checked
# here; whether a dialect declares it is asked of the dialect registry when a rollout is prepared.
WIRE_API_PATTERN = r"^[a-z][a-z0-9_.-]{0,63}$"
WireApi = Annotated[str, StringConstraints(pattern=WIRE_API_PATTERN)]
WIRE_API_DESCRIPTION = (
    "the API the endpoint speaks: chat (OpenAI chat completions, translated for every harness; the only one with token ids), "
    "or in black_box mode the harness's own, passed through untranslated: responses (Codex), messages (Claude Code), gemini (Gemini CLI), "
    "or the API of a dialect a plug-in registers"
)


def _check_relative_path(path: str) -> str:
    if not path or len(path) > MAX_PATH_CHARS:
        raise ValueError(f"file path must be 1..{MAX_PATH_CHARS} characters, got {len(path)}")
    if "\x00" in path:
        raise ValueError(f"file path {path!r} contains a NUL byte")
    if path.startswith("/"):
        raise ValueError(f"file path {path!r} must be relative to the workspace, not absolute")
    norm = posixpath.normpath(path)
    if norm == "." or norm.startswith("../") or norm == "..":
        raise ValueError(f"file path {path!r} must stay inside the workspace (no '..')")
    for part in norm.split("/"):
        if len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            raise ValueError(f"file path {path[:60]!r}...: a name in it is over {MAX_NAME_BYTES} bytes; shorten it")
    return norm


def _check_file_tree(paths: list[str]) -> None:
    """Every path names one file, and no file is also a directory of another (both cannot be written)."""
    seen: set[str] = set()
    for path in paths:
        if path in seen:
            raise ValueError(f"file path {path!r} is given twice (after normalising); give each file once")
        seen.add(path)
    for path in paths:
        parent = posixpath.dirname(path)
        while parent:
            if parent in seen:
                raise ValueError(f"{parent!r} is both a file and the directory of {path!r}; rename one of them")
            parent = posixpath.dirname(parent)


def is_loopback(host: str) -> bool:
    """`host` (a name or an address, without port or brackets) is this machine's loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_authority(url: str) -> str:
    """'http://u:p@h:1/v1' -> 'u:p@h:1', read without urlsplit (whose errors may quote it)."""
    rest = url.partition("://")[2] or url
    return re.split(r"[/?#]", rest, maxsplit=1)[0]


def url_without_credentials(url: str) -> str:
    """`url` safe to show: no user name or password, no query string or fragment (keys travel there)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    shown = scheme + sep + authority.rpartition("@")[2] + rest[len(authority) :]
    return re.split(r"[?#]", shown, maxsplit=1)[0]


def check_http_url(url: str, name: str = "base_url", key_name: str = "api_key") -> str:
    """`url` parsed as urllib parses it, or a clear ValueError (e.g. 'http://[::1' raises in urlsplit).
    Credentials are refused, in the URL's user info or its query string: the URL is shown (phases,
    results, the store, the catalog), only the key (`key_name`) is kept secret."""
    if "@" in url_authority(url):
        raise ValueError(
            f"{name} holds a user name or password ('user:pass@host'): give the URL without it and pass the key as {key_name} (it is kept secret; a URL is not)"
        )
    if "?" in url or "#" in url:
        raise ValueError(f"{name} has a query string or fragment ('?...', '#...'): give http(s)://host[:port]/path and pass a key as {key_name}")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port out of range or not a number raises here
    except ValueError as e:  # its text quotes only the port or the brackets: no credentials are left by now
        raise ValueError(f"{name} is not a valid URL ({e}); give http(s)://host[:port]/path") from None
    if parts.scheme in ("http", "https") and not parts.hostname:
        raise ValueError(f"{name} has no host; give http(s)://host[:port]/path")
    return url


MAX_MAPPING_CHARS = 100_000


def bounded_mapping(value: dict[str, Any], name: str) -> dict[str, Any]:
    if len(repr(value)) > MAX_MAPPING_CHARS:
        raise ValueError(f"{name} is larger than {MAX_MAPPING_CHARS} characters")
    return value


SURROGATE = re.compile("[\ud800-\udfff]")


# Fields whose object values are file contents, which are written as bytes and may hold NUL.
CONTENT_FIELDS = frozenset({"files"})


def check_text(value: Any, name: str) -> Any:
    """Raw input of field `name`: every string valid Unicode (a lone surrogate cannot be encoded
    into a file, an argv or a header) and free of NUL bytes (none can pass in an argv, an
    environment variable, a path or a header: a command, an id or an option with one would fail
    only once the rollout is under way), except the contents of files; lists/objects at most
    MAX_NESTING levels deep (deeper ones exhaust the recursion of whatever copies or serialises them
    later). Iterative: any depth is safe."""
    stack: list[tuple[Any, str, int, bool]] = [(value, name, 0, False)]
    while stack:
        v, where, depth, content = stack.pop()
        if isinstance(v, str):
            if not v.isascii() and (m := SURROGATE.search(v)):
                raise ValueError(f"{where} contains a lone surrogate (U+{ord(m.group()):04X} at character {m.start()}); send valid Unicode text")
            if not content and "\x00" in v:
                raise ValueError(
                    f"{where} contains a NUL byte (at character {v.index(chr(0))}); remove it: no command line, environment variable, path or name can hold one"
                )
        elif isinstance(v, (dict, list, tuple)):
            if depth >= MAX_NESTING:
                raise ValueError(f"{name} is nested more than {MAX_NESTING} levels deep; flatten it")
            contents = depth == 0 and isinstance(v, dict) and name in CONTENT_FIELDS
            for k, item in v.items() if isinstance(v, dict) else enumerate(v):
                key = f"{where}[{k[:40]!r}]" if isinstance(k, str) else f"{where}[{k!r}]"
                if isinstance(k, str):
                    stack.append((k, f"a key of {where}", depth + 1, False))
                stack.append((item, key, depth + 1, contents))
    return value


class CheckedText(BaseModel):
    """A wire type whose every field (its subclasses' too) is checked as text first: text reaches
    files, argv and headers. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _valid_text(cls, v: Any, info: ValidationInfo) -> Any:
        return check_text(v, info.field_name or "value")


class Task(CheckedText):
    """What the agent must do and how it is checked.

    `files` are written into the workspace before `setup` runs; `setup` runs before the agent
    starts; `verify` runs after it. A verify command may write one float to the file named by
    `$HARNESS_ENV_REWARD_FILE` (also reachable at /logs/verifier/reward.txt and
    /root/logs/verifier/reward.txt under bubblewrap); otherwise the reward is passed/total.
    """

    instruction: str = Field(min_length=1, max_length=MAX_INSTRUCTION_CHARS)
    setup: list[str] = Field(default_factory=list, max_length=MAX_COMMANDS)
    verify: list[str] = Field(default_factory=list, max_length=MAX_COMMANDS)
    files: dict[str, str] = Field(default_factory=dict)
    task_id: str | None = Field(default=None, max_length=256)
    metadata: dict[str, Any] = Field(default_factory=dict)
    image: str | None = Field(default=None, min_length=1, max_length=MAX_IMAGE_CHARS, description=IMAGE_DESCRIPTION)

    @field_validator("setup", "verify")
    @classmethod
    def _commands_bounded(cls, cmds: list[str]) -> list[str]:
        for i, cmd in enumerate(cmds):
            if not cmd.strip():
                raise ValueError(f"command #{i + 1} is empty")
            if len(cmd) > MAX_COMMAND_CHARS:
                raise ValueError(f"command #{i + 1} is {len(cmd)} characters; the limit is {MAX_COMMAND_CHARS}")
        return cmds

    @field_validator("files")
    @classmethod
    def _files_bounded(cls, files: dict[str, str]) -> dict[str, str]:
        if len(files) > MAX_FILES:
            raise ValueError(f"{len(files)} files given; the limit is {MAX_FILES}")
        total = 0
        out: dict[str, str] = {}
        norms: list[str] = []
        for path, content in files.items():
            norm = _check_relative_path(path)
            norms.append(norm)
            if len(content) > MAX_FILE_CHARS:
                raise ValueError(f"file {path!r} is {len(content)} characters; the limit is {MAX_FILE_CHARS}")
            total += len(content)
            out[norm] = content
        if total > MAX_TOTAL_FILE_CHARS:
            raise ValueError(f"files total {total} characters; the limit is {MAX_TOTAL_FILE_CHARS}")
        _check_file_tree(norms)
        return out

    @field_validator("metadata")
    @classmethod
    def _metadata_bounded(cls, meta: dict[str, Any]) -> dict[str, Any]:
        return bounded_mapping(meta, "metadata")


class Endpoint(CheckedText):
    """A policy endpoint: OpenAI-compatible chat completions, or (black_box only) one that speaks
    the harness's own wire API. The key never leaves the server process."""

    base_url: str = Field(min_length=1, max_length=2048)
    api_key: SecretStr = SecretStr("")
    model: str = Field(min_length=1, max_length=512)
    wire_api: WireApi = Field("chat", description=WIRE_API_DESCRIPTION)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        check_http_url(url)  # first: the message below quotes the URL, which must hold no credentials
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {url!r}")
        return url.rstrip("/")


# The endpoint of a rollout whose agent calls no model (Harbor's oracle and nop): nothing listens at
# a .invalid name (RFC 6761), and the engine neither checks nor probes it.
NO_MODEL_ENDPOINT = Endpoint(base_url="http://no-model.invalid/v1", model="none")
