"""The import graph of the package, read from its source: which part may import which.

DESIGN.md's direction (`server -> core, envs, families, models`; `envs, families -> core, models`;
`core -> models`; `client -> models`) is checked here, not by eye. Every import counts: at module
level, inside a function (lazy), under TYPE_CHECKING, and `importlib.import_module("harness_env.…")`
with a literal name, since each one is a dependency a reader and a packager must follow.

Two kinds of failure, each naming the file and line of every import at fault:
- a part imports a part it may not (ALLOWED below);
- the parts import each other in a circle (so no part can be understood, tested or shipped alone).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "harness_env"
NOT_PACKAGE = {"tests", "bench", "examples", "runs", "deploy", "docs", "dev"}

# What each part of the package may import besides itself. A part is a subpackage (models, core,
# ...), the command line (cli.py and cli_*.py), or one of the root modules.
ALLOWED: dict[str, set[str]] = {
    "models": set(),  # the wire types are a leaf: a client installs them alone
    "client": {"models"},  # a trainer host never imports server code
    "storage": {"models"},  # a compact result, readable with the client install
    "core": {"models"},
    "envs": {"core", "models"},
    "families": {"core", "models"},
    "rollout": {"core", "envs", "families", "models"},
    "package": {"models", "rollout"},  # harness_env/__init__.py: the in-process API, lazily
    "evals": {"client", "core", "envs", "families", "models", "rollout", "storage"},
    "server": {"core", "envs", "evals", "families", "models", "package", "storage"},
    "cli": {"client", "core", "envs", "evals", "families", "models", "rollout", "server", "storage", "package"},
}


def part_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "package"
    top = parts[1]
    return "cli" if top == "cli" or top.startswith("cli_") else top


def package_modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in NOT_PACKAGE or rel.parts[0].startswith("."):
            continue
        name = ".".join((PACKAGE, *rel.with_suffix("").parts))
        out[name.removesuffix(".__init__")] = path
    return out


def imported(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module of the package, line) for every import in the file, wherever it stands
    (`from harness_env import envs` imports harness_env.envs, not the package's __init__)."""
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            subs = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules]
            names = subs if len(subs) == len(node.names) else [source, *subs]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        out += [(n, node.lineno) for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")]
    return out


def part_edges() -> dict[tuple[str, str], list[str]]:
    """(importing part, imported part) -> where ("path:line imports module")."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    modules = package_modules()
    for module, path in modules.items():
        src = part_of(module)
        for target, line in imported(module, path, modules):
            dst = part_of(target)
            if dst != src:
                edges[src, dst].append(f"{path.relative_to(ROOT)}:{line} imports {target}")
    return edges


def test_the_graph_is_read():
    """The reader finds what is plainly there (so the checks below cannot pass on an empty graph)."""
    edges = part_edges()
    assert len(package_modules()) > 200
    assert ("core", "models") in edges and ("server", "core") in edges and ("cli", "server") in edges


def test_each_part_imports_only_what_it_may():
    edges = part_edges()
    wrong = [f"{src} -> {dst}:\n    " + "\n    ".join(where) for (src, dst), where in sorted(edges.items()) if dst not in ALLOWED.get(src, set())]
    assert not wrong, (
        "imports against the direction of docs/architecture.md (move the shared piece to the part both may import, "
        "or have the plug-in register itself):\n" + "\n".join(wrong)
    )


def test_no_two_parts_import_each_other():
    edges = part_edges()
    graph: dict[str, set[str]] = defaultdict(set)
    for src, dst in edges:
        graph[src].add(dst)
    circles = []

    def walk(start: str, node: str, trail: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt == start:
                circles.append([*trail, start])
            elif nxt not in trail and nxt > start:  # each circle once, from its smallest part
                walk(start, nxt, [*trail, nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    described = []
    for circle in circles:
        hops = [f"  {a} -> {b}, e.g. {edges[a, b][0]}" for a, b in zip(circle, circle[1:])]
        described.append(" -> ".join(circle) + "\n" + "\n".join(hops))
    assert not circles, "parts of the package import each other in a circle:\n" + "\n".join(described)
