"""README.md is the Space's card and the project's front page; docs/ holds the reference."""

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def front_matter() -> dict:
    match = re.match(r"---\n(.*?)\n---\n", README, re.S)
    assert match, "README.md must start with the Space's YAML front matter"
    return yaml.safe_load(match.group(1))


def test_the_front_matter_makes_a_docker_space_that_opens_on_the_web_ui():
    meta = front_matter()
    assert meta["sdk"] == "docker" and meta["base_path"] == "/web"
    openenv = yaml.safe_load((ROOT / "openenv.yaml").read_text())
    assert meta["app_port"] == openenv["port"] == 7860
    assert "openenv" in meta["tags"]
    for key in ("title", "emoji", "colorFrom", "colorTo", "short_description", "license"):
        assert meta.get(key), key
    assert len(meta["short_description"]) <= 60  # the Hub refuses longer ones


def test_the_front_page_is_short():
    assert len(README.splitlines()) <= 250


def _anchors(text: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_every_link_between_the_pages_resolves():
    for page in PAGES:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.name}: {target}"
            if anchor and dest.suffix == ".md":
                assert anchor in _anchors(dest.read_text()), f"{page.name}: {target}"
