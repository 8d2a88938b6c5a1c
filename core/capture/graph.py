"""The turn graph: which turns continue which, by exact token prefix.

A turn whose prompt starts with an earlier turn's prompt + completion (Turn.continues, the one
prefix relation) continues that turn's branch; otherwise it starts a new one (harnesses rewrite
their history: compaction, dropped reasoning, re-serialised tool arguments, sub-agents). Auxiliary
turns (titles, summaries) and failed calls belong to no branch. Nothing is re-tokenized: only the
engine's own ids are compared.
"""

from __future__ import annotations

from harness_env.models import GraphSummary, Turn


def link_turns(turns: list[Turn]) -> GraphSummary:
    """Set `parent` and `branch` on each turn (in place) and summarise the graph."""
    summary = GraphSummary(turns=len(turns))
    heads: list[Turn] = []  # per branch: its last turn
    for t in sorted(turns, key=lambda t: t.index):
        if t.link == "retry":  # given an earlier turn's answer again: that turn is its parent, it has no branch
            summary.links["retry"] = summary.links.get("retry", 0) + 1
            continue
        t.parent = t.branch = None
        if t.purpose == "auxiliary":
            summary.auxiliary_turns += 1
            continue
        if not t.answered:
            summary.failed_turns += 1
            continue
        found = None
        if t.prompt_token_ids and t.completion_token_ids:
            # The latest branch first: a harness continues what it did last.
            found = next((b for b in range(len(heads) - 1, -1, -1) if t.continues(heads[b])), None)
        if found is None:
            heads.append(t)
            found = len(heads) - 1
        else:
            t.parent = heads[found].index
        t.branch = found
        heads[found] = t
    summary.branches = len(heads)
    return summary


def summarise_rows(summary: GraphSummary, rows) -> GraphSummary:
    """Fill the row-derived counts (trainable tokens, untrainable branches) into `summary`."""
    summary.trainable_tokens = sum(sum(r.loss_mask) for r in rows if r.trainable)
    summary.untrainable_branches = sum(1 for r in rows if not r.trainable)
    return summary
