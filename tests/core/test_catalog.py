import pytest

from harness_env.core.catalog import describe, normalise_base_url, resolve_endpoint, to_request
from harness_env.core.errors import InvalidRequestError
from harness_env.models import RolloutArgs


def _args(**kw):
    return RolloutArgs(instruction="x", **kw)


@pytest.mark.parametrize(
    "url,want",
    [
        ("http://h:8000", "http://h:8000/v1"),
        ("http://h:8000/", "http://h:8000/v1"),
        ("http://h:8000/v1/", "http://h:8000/v1"),
        ("http://h/v1/chat/completions", "http://h/v1"),
        ("https://api.example/openai/v1", "https://api.example/openai/v1"),
    ],
)
def test_base_url_normalised(url, want):
    assert normalise_base_url(url) == want


def test_vllm_from_environment():
    env = {"VLLM_URL": "http://gpu:8000", "VLLM_MODEL": "Qwen/Qwen3-8B"}
    ep, entry = resolve_endpoint(_args(endpoint="vllm"), env)
    assert (ep.base_url, ep.model, ep.api_key.get_secret_value(), entry.name) == ("http://gpu:8000/v1", "Qwen/Qwen3-8B", "", "vllm")


def test_explicit_arguments_win():
    env = {"OPENAI_BASE_URL": "https://a/v1", "OPENAI_API_KEY": "env-key", "OPENAI_MODEL": "env-model"}
    ep, _ = resolve_endpoint(_args(endpoint="openai", model="mine", api_key="my-key", base_url="http://b:1"), env)
    assert (ep.base_url, ep.model, ep.api_key.get_secret_value()) == ("http://b:1/v1", "mine", "my-key")


@pytest.mark.parametrize(
    "kw,env,needle",
    [
        ({"endpoint": "vllm"}, {}, "VLLM_MODEL"),
        ({"endpoint": "hf_router"}, {"HF_ROUTER_MODEL": "m"}, "HF_ROUTER_API_KEY"),
        ({"endpoint": "openai"}, {}, "OPENAI_API_KEY"),
        ({"endpoint": "bogus"}, {}, "unknown endpoint 'bogus'"),
        ({}, {}, "no endpoint"),
        ({"base_url": "http://h:1"}, {}, "no model"),
        ({"base_url": "ftp://h", "model": "m"}, {}, "http:// or https://"),
        ({"base_url": "http://evil:1", "model": "m"}, {"HARNESS_ENV_ALLOWED_HOSTS": "127.0.0.1"}, "not allowed"),
    ],
)
def test_missing_or_bad_values_name_what_to_set(kw, env, needle):
    with pytest.raises(InvalidRequestError, match=needle):
        resolve_endpoint(_args(**kw), env)


def test_per_kind_defaults_for_thinking_and_top_logprobs():
    env = {"HF_ROUTER_API_KEY": "k", "HF_ROUTER_MODEL": "m", "VLLM_MODEL": "m"}
    hf = to_request(_args(endpoint="hf_router", top_logprobs=20), env)
    assert hf.top_logprobs == 5 and hf.disable_thinking is True
    assert to_request(_args(endpoint="hf_router", disable_thinking=False), env).disable_thinking is False
    vllm = to_request(_args(endpoint="vllm", top_logprobs=20), env)
    assert vllm.top_logprobs == 20 and vllm.disable_thinking is False


def test_task_validation_errors_are_one_clear_line():
    with pytest.raises(InvalidRequestError, match="inside the workspace"):
        to_request(_args(base_url="http://h:1", model="m", files={"../x": "y"}), {})


def test_a_local_image_only_for_a_trusted_caller():
    args = _args(base_url="http://h:1", model="m", image="oci-archive:/etc/passwd")
    with pytest.raises(InvalidRequestError, match="names a file on the server's disk"):
        to_request(args, {})
    trusted = to_request(args, {}, trusted=True, metadata={"source": "file"})  # the CLI, on this machine
    assert (trusted.task.image, trusted.task.metadata) == ("oci-archive:/etc/passwd", {"source": "file"})
    assert to_request(_args(base_url="http://h:1", model="m", image="ghcr.io/o/task:1"), {}).task.image == "ghcr.io/o/task:1"


def test_describe_never_shows_keys():
    out = describe({"OPENAI_API_KEY": "sk-very-secret", "OPENAI_MODEL": "m"})
    assert "sk-very-secret" not in repr(out)
    assert {e["name"]: e["configured"] for e in out}["openai"] is True


CATALOG_ENV = {
    "OPENAI_API_KEY": "sk-server",
    "OPENAI_MODEL": "m",
    "HF_ROUTER_API_KEY": "hf-server",
    "HF_ROUTER_MODEL": "m",
    "VLLM_URL": "http://gpu:8000",
    "VLLM_API_KEY": "vllm-server",
    "VLLM_MODEL": "m",
}


@pytest.mark.parametrize("endpoint,key_var", [("openai", "OPENAI_API_KEY"), ("hf_router", "HF_ROUTER_API_KEY"), ("vllm", "VLLM_API_KEY")])
def test_a_catalog_key_is_never_sent_to_another_base_url(endpoint, key_var):
    with pytest.raises(InvalidRequestError, match=f"would send the server's {key_var} to that host: drop base_url .* or pass your own api_key") as e:
        resolve_endpoint(_args(endpoint=endpoint, base_url="http://attacker:1/v1"), CATALOG_ENV)
    assert CATALOG_ENV[key_var] not in str(e.value)


def test_a_catalog_key_goes_to_its_own_url_however_spelled_and_an_explicit_key_anywhere():
    for url in ("https://api.openai.com/v1", "https://api.openai.com", "https://api.openai.com/v1/chat/completions"):
        ep, _ = resolve_endpoint(_args(endpoint="openai", base_url=url), CATALOG_ENV)
        assert ep.api_key.get_secret_value() == "sk-server" and ep.base_url == "https://api.openai.com/v1"
    ep, _ = resolve_endpoint(_args(endpoint="openai", base_url="http://mine:1", api_key="mine"), CATALOG_ENV)
    assert (ep.base_url, ep.api_key.get_secret_value()) == ("http://mine:1/v1", "mine")
    # vllm without a key has nothing to leak: another base_url is fine.
    ep, _ = resolve_endpoint(_args(endpoint="vllm", base_url="http://other:8000"), {"VLLM_MODEL": "m"})
    assert (ep.base_url, ep.api_key.get_secret_value()) == ("http://other:8000/v1", "")


def test_a_malformed_catalog_url_names_its_variable():
    with pytest.raises(InvalidRequestError, match="VLLM_URL is not a valid URL"):
        resolve_endpoint(_args(endpoint="vllm"), {"VLLM_URL": "http://[::1", "VLLM_MODEL": "m"})


def test_hf_router_falls_back_to_the_token_huggingface_hub_stores(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))  # where `huggingface-cli login` stores it
    monkeypatch.delenv("HF_TOKEN", raising=False)
    env = {"HF_ROUTER_MODEL": "m"}
    with pytest.raises(InvalidRequestError, match="huggingface-cli login"):
        to_request(_args(endpoint="hf_router"), env)
    (tmp_path / "token").write_text("hf_stored_token_0123456789")
    assert to_request(_args(endpoint="hf_router"), env).endpoint.api_key.get_secret_value() == "hf_stored_token_0123456789"
    assert describe(env)[[e["name"] for e in describe(env)].index("hf_router")]["api_key_set"] is True
    with pytest.raises(InvalidRequestError, match="HF_ROUTER_API_KEY"):  # the stored token goes to the router only
        to_request(_args(endpoint="hf_router", base_url="http://127.0.0.1:9/v1"), env)


def test_a_catalog_url_with_credentials_is_refused_and_never_listed_with_them():
    env = {
        "VLLM_URL": "http://bob:hunter2-pw@gpu:8000/v1",
        "VLLM_MODEL": "m",
        "OPENAI_BASE_URL": "https://api.example/v1?key=hunter2-pw",
        "OPENAI_API_KEY": "k" * 12,
    }
    listed = {e["name"]: e for e in describe(env)}
    assert listed["vllm"]["base_url"] == "http://gpu:8000/v1" and listed["openai"]["base_url"] == "https://api.example/v1"
    for name, key_var in (("vllm", "VLLM_API_KEY"), ("openai", "OPENAI_API_KEY")):
        assert listed[name]["configured"] is False and key_var in listed[name]["problem"]
        with pytest.raises(InvalidRequestError, match=key_var) as e:
            resolve_endpoint(_args(endpoint=name), env)
        assert "hunter2" not in str(e.value)
    assert "hunter2" not in repr(listed)
    assert listed["hf_router"]["problem"] is None


def test_an_unparsable_catalog_url_is_a_problem_in_the_listing_not_a_crash():
    listed = {e["name"]: e for e in describe({"VLLM_URL": "http://[::1", "VLLM_MODEL": "m"})}
    assert listed["vllm"]["configured"] is False and "not a valid URL" in listed["vllm"]["problem"]


def test_the_credentials_of_a_catalog_url_are_known_as_secrets_to_mask():
    from harness_env.core.catalog import url_credentials

    env = {
        "VLLM_URL": "http://bob:hunter2-pw@gpu:8000/v1",
        "OPENAI_BASE_URL": "https://tok-only-user@api.example/v1",
        "HF_ROUTER_BASE_URL": "https://router.example/v1",
    }
    assert sorted(url_credentials(env)) == ["bob:hunter2-pw", "hunter2-pw", "tok-only-user"]
