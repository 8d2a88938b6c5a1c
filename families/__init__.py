"""Task families: a family turns its task records into what the agent gets and grades the
submission itself (families/svg_icon: an icon graded by rendering and a vision-language judge).
Each is registered here; core/pipeline.py prepares a request with it."""

from __future__ import annotations

from harness_env.core.registry import family_names, get_family, register_family


def _svg_icon() -> type:
    from harness_env.families.svg_icon.family import SvgIconFamily  # imported on first use

    return SvgIconFamily


register_family("svg_icon", _svg_icon)

__all__ = ["family_names", "get_family"]
