"""The MCP summary shows the turn graph: branches and turns per link kind."""

from harness_env.core.capture.graph import link_turns
from harness_env.models import GraphSummary, RolloutResult, Turn, summarize


def test_the_summary_counts_each_link_kind_of_the_graph():
    turns = [
        Turn(index=0, prompt_token_ids=[1], completion_token_ids=[2], per_token_logps=[-1.0], upstream_status=200),
        Turn(index=1, prompt_token_ids=[1, 2, 3], completion_token_ids=[4], per_token_logps=[-1.0], upstream_status=200),
        Turn(index=2, upstream_status=200, parent=1, link="retry"),
        Turn(index=3, prompt_token_ids=[9], completion_token_ids=[9], upstream_status=200, purpose="auxiliary"),
    ]
    summary = summarize(RolloutResult(proxy_turns=turns, graph=link_turns(turns)))
    assert summary.branches == 1
    assert list(summary.links) == ["extends", "retry", "auxiliary", "new_thread"]  # in LinkKind's order
    assert "turn graph: 1 branch; links: 1 extends, 1 retry, 1 auxiliary, 1 new_thread" in summary.text()


def test_kinds_the_summary_does_not_know_are_left_out():
    """A result read back from anywhere may carry any keys: the summary stays bounded."""
    graph = GraphSummary(branches=2, links={"compaction": 1, **{f"made-up-{i}": i for i in range(1000)}})
    summary = summarize(RolloutResult(graph=graph))
    assert summary.links == {"compaction": 1} and "2 branches" in summary.text()
