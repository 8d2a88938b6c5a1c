"""Endpoint shorthands: `endpoint="vllm" | "openai" | "hf_router"` resolved from the server's
environment. Explicit arguments win; a missing value is an error naming the variable to set.
Keys are read here and never shown (the `catalog` tool reports only whether one is set), and a
catalog key is only ever sent to its own entry's URL: a caller's base_url with a catalog endpoint
whose key would be used is refused. A URL is shown (phases, results, the catalog), so one holding
credentials (`user:pass@`, a query string) is refused, the server's own variables included: keys
go in api_key or the entry's key variable."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import SecretStr, ValidationError

from harness_env.core.capture.redact import register_secret
from harness_env.core.errors import InvalidRequestError, describe_validation_error
from harness_env.models import (
    NAMED_TASK_INSTRUCTION,
    NO_MODEL_ENDPOINT,
    Endpoint,
    RolloutArgs,
    RolloutOptions,
    RolloutRequest,
    Task,
    check_http_url,
    url_authority,
    url_without_credentials,
)


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    url_var: str
    key_var: str
    model_var: str
    default_url: str | None
    default_model: str | None
    disable_thinking: bool  # default when the caller does not say
    top_logprobs_cap: int  # what the service accepts at most


CATALOG: dict[str, CatalogEntry] = {
    "vllm": CatalogEntry("vllm", "VLLM_URL", "VLLM_API_KEY", "VLLM_MODEL", "http://127.0.0.1:8000/v1", None, False, 20),
    "openai": CatalogEntry("openai", "OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL", "https://api.openai.com/v1", "gpt-4.1-mini", False, 20),
    "hf_router": CatalogEntry("hf_router", "HF_ROUTER_BASE_URL", "HF_ROUTER_API_KEY", "HF_ROUTER_MODEL", "https://router.huggingface.co/v1", None, True, 5),
}
EXPLICIT_TOP_LOGPROBS_CAP = 20


def normalise_base_url(url: str) -> str:
    """`http://h:8000`, `http://h:8000/`, `.../v1/chat/completions` -> `.../v1`; other paths kept."""
    url = url.strip().rstrip("/")
    if url.endswith("/chat/completions"):
        url = url[: -len("/chat/completions")]
    if urlsplit(url).path in ("", "/"):
        url += "/v1"
    return url


def catalog_key_of(entry: CatalogEntry, env: dict[str, str]) -> str:
    """The server's key for a catalog entry: its variable, or for hf_router the token that
    huggingface_hub stores for a logged-in user (`huggingface-cli login`; HF_TOKEN)."""
    key = env.get(entry.key_var) or ""
    if not key and entry.name == "hf_router":
        try:
            from huggingface_hub import get_token
        except ImportError:
            return ""
        key = get_token() or ""
        register_secret(key)  # read from a file, not the environment: mask it like the others
    return key


def resolve_endpoint(args: RolloutArgs, env: dict[str, str] | None = None) -> tuple[Endpoint, CatalogEntry | None]:
    env = dict(os.environ) if env is None else env
    entry = None
    if args.endpoint:
        entry = CATALOG.get(args.endpoint)
        if entry is None:
            raise InvalidRequestError(f"unknown endpoint {args.endpoint!r}; choose one of {', '.join(CATALOG)} or pass base_url and model")
    own_url = (entry and (env.get(entry.url_var) or entry.default_url)) or ""
    base_url = args.base_url or own_url
    model = args.model or (entry and (env.get(entry.model_var) or entry.default_model)) or ""
    catalog_key = catalog_key_of(entry, env) if entry else ""
    key = args.api_key.get_secret_value() or catalog_key
    if not base_url and not args.agent_calls_model:
        return NO_MODEL_ENDPOINT, None
    if not base_url:
        raise InvalidRequestError("no endpoint: pass base_url (and model), or endpoint=vllm|openai|hf_router")
    if entry and args.base_url and not args.api_key.get_secret_value() and catalog_key:
        _check_own_url(entry, args.base_url, own_url)
    if not model:
        hint = f" or set {entry.model_var} on the server" if entry else ""
        raise InvalidRequestError(f"no model for endpoint {args.endpoint or base_url}: pass model{hint}")
    if entry and entry.name != "vllm" and not key:
        login = " (or log the server's user in with `huggingface-cli login`)" if entry.name == "hf_router" else ""
        raise InvalidRequestError(f"endpoint {entry.name!r} needs an API key: pass api_key or set {entry.key_var} on the server{login}")
    url_source = "base_url" if args.base_url else (entry.url_var if entry else "base_url")
    _check_url(base_url, url_source, entry)
    try:
        resolved = Endpoint(base_url=_normalised(base_url, url_source), api_key=SecretStr(key), model=model, wire_api=args.wire_api)
    except ValidationError as e:
        raise InvalidRequestError(f"invalid endpoint: {e.errors()[0]['msg']}") from None
    check_allowed_host(resolved.base_url, env)
    return resolved, entry


def _check_url(url: str, source: str, entry: CatalogEntry | None) -> None:
    """A clear error, naming where the URL came from, for one that cannot be used or shown."""
    try:
        if source == "base_url" or entry is None:
            check_http_url(url)
        else:
            check_http_url(url, f"the server's {source}", entry.key_var)
    except ValueError as e:
        raise InvalidRequestError(str(e)) from None


def url_problem(entry: CatalogEntry, url: str) -> str | None:
    """Why the server's URL for `entry` cannot be used, or None."""
    try:
        _check_url(url, entry.url_var, entry)
        normalise_base_url(url)
    except (InvalidRequestError, ValueError) as e:
        return str(e)
    return None


def _check_own_url(entry: CatalogEntry, base_url: str, own_url: str) -> None:
    """A catalog key goes only to its entry's own URL: another base_url would get the server's key."""
    if _normalised(base_url, "base_url") != _normalised(own_url, entry.url_var):
        raise InvalidRequestError(
            f"endpoint {entry.name!r} with your own base_url would send the server's {entry.key_var} to that host: "
            f"drop base_url (to use {entry.name!r} as configured), or pass your own api_key with it"
        )


def _normalised(url: str, name: str) -> str:
    try:
        return normalise_base_url(url)
    except ValueError as e:  # urlsplit refuses e.g. 'http://[::1'
        raise InvalidRequestError(f"{name} is not a valid URL ({e}); give http(s)://host[:port]/path") from None


def check_allowed_host(base_url: str, env: dict[str, str]) -> None:
    """HARNESS_ENV_ALLOWED_HOSTS (comma-separated) restricts which hosts rollouts may call."""
    allowed = [h.strip().lower() for h in env.get("HARNESS_ENV_ALLOWED_HOSTS", "").split(",") if h.strip()]
    host = (urlsplit(base_url).hostname or "").lower()
    if allowed and host not in allowed:
        raise InvalidRequestError(f"endpoint host {host!r} is not allowed here (HARNESS_ENV_ALLOWED_HOSTS: {', '.join(allowed)})")


def to_request(args: RolloutArgs, env: dict[str, str] | None = None, *, trusted: bool = False, metadata: dict[str, Any] | None = None) -> RolloutRequest:
    """Resolve tool arguments into a full RolloutRequest (clear InvalidRequestError otherwise): the
    one resolver of every face, the CLI's included. `trusted`: the caller is on this machine (the
    CLI), so its image may be a local transport, as in core/pipeline.prepare; a remote caller's
    must be a registry reference. `metadata`: the Task's, which a task file carries and the flat
    arguments have no field for."""
    endpoint, entry = resolve_endpoint(args, env)
    cap = entry.top_logprobs_cap if entry else EXPLICIT_TOP_LOGPROBS_CAP
    disable_thinking = args.disable_thinking if args.disable_thinking is not None else bool(entry and entry.disable_thinking)
    try:
        task = Task(
            instruction=args.instruction or NAMED_TASK_INSTRUCTION,  # empty only for a task named in the harness options
            setup=args.setup or [],
            verify=args.verify or [],
            files=args.files or {},
            task_id=args.task_id or None,
            metadata=metadata or {},
            image=_image(args.image, trusted),
        )
        options = args.model_dump(include=set(RolloutOptions.model_fields))
        options["top_logprobs"] = min(args.top_logprobs, cap)
        return RolloutRequest(task=task, endpoint=endpoint, disable_thinking=disable_thinking, **options)
    except ValidationError as e:
        raise InvalidRequestError(describe_validation_error(e)) from None


def _image(ref: str, trusted: bool) -> str | None:
    """The task's image: a remote caller's only as a registry reference (a local transport would
    read the server's files)."""
    if not ref:
        return None
    from harness_env.core.sandbox.images import check_remote_image  # not at the top: every command line loads the catalog

    return ref if trusted else check_remote_image(ref)


def url_credentials(env: dict[str, str]) -> list[str]:
    """The user info of the server's catalog URLs that hold one (refused when used), and its
    password: secrets to mask wherever they could still show (logs, the proxy's records)."""
    found = []
    for entry in CATALOG.values():
        userinfo = url_authority(env.get(entry.url_var) or "").rpartition("@")[0]
        if userinfo:
            found += [userinfo, userinfo.partition(":")[2]]
    return [secret for secret in found if secret]


def describe(env: dict[str, str] | None = None) -> list[dict]:
    """What the `catalog` tool shows: shorthands, where values come from, whether configured (and
    if a value is unusable, why). No keys, and no URL's user info or query string."""
    env = dict(os.environ) if env is None else env
    out = []
    for e in CATALOG.values():
        url = env.get(e.url_var) or e.default_url
        model = env.get(e.model_var) or e.default_model
        has_key = bool(catalog_key_of(e, env))
        problem = url_problem(e, url) if url else None
        out.append(
            {
                "name": e.name,
                "base_url": None if not url else url_without_credentials(url if problem else normalise_base_url(url)),
                "model": model,
                "api_key_set": has_key,
                "configured": bool(url and model and (has_key or e.name == "vllm") and not problem),
                "problem": problem,
                "variables": [e.url_var, e.key_var, e.model_var],
                "disable_thinking_default": e.disable_thinking,
                "top_logprobs_cap": e.top_logprobs_cap,
            }
        )
    return out
