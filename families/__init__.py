"""Task families: a family turns its task records into what the agent gets and grades the
submission itself (families/svg_icon: an icon graded by rendering and a vision-language judge).
Each is registered here; core/pipeline.py prepares a request with it."""

from __future__ import annotations

from collections.abc import Callable

from harness_env.core.registry import FAMILY_COMMANDS, family_names, get_family, register_family


def _svg_icon() -> type:
    from harness_env.families.svg_icon.family import SvgIconFamily  # imported on first use

    return SvgIconFamily


def _svg_dataset() -> Callable[[list[str]], int]:
    from harness_env.families.svg_icon.dataset import main

    return main


register_family(
    "svg_icon",
    _svg_icon,
    commands={"svg-dataset": ("build svg_icon task records from icon parquet shards or a CSV of briefs (--help for its options)", _svg_dataset)},
)

__all__ = ["FAMILY_COMMANDS", "family_names", "get_family"]
