from harness_env.envs.common.config import deep_merge, keep_listed, proxy_root


def test_deep_merge_does_not_mutate():
    base = {"a": {"b": 1}}
    assert deep_merge(base, {"a": {"c": 2}}) == {"a": {"b": 1, "c": 2}} and base == {"a": {"b": 1}}


def test_a_caller_adds_to_our_list_but_never_lifts_it():
    merged = deep_merge({"permissions": {"deny": ["WebFetch"]}}, {"permissions": {"deny": ["Bash(rm:*)", "WebFetch"]}})
    assert keep_listed(merged, ("permissions", "deny"), ("WebFetch",)) == {"permissions": {"deny": ["WebFetch", "Bash(rm:*)"]}}
    assert keep_listed({"permissions": "all"}, ("permissions", "deny"), ("WebFetch",)) == {"permissions": {"deny": ["WebFetch"]}}


def test_the_proxy_root_drops_the_version_segment():
    assert proxy_root("http://x:1/v1/") == proxy_root("http://x:1/v1") == "http://x:1"
