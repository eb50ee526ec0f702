"""The import graph of ``cosmos3_core`` has no circle, and its layers only look down.

Every ``import`` / ``from … import`` of every module counts, module-level and inside functions alike (a lazy import
is still a dependency); imports under ``if TYPE_CHECKING:`` are left out (they never run). Importing a submodule
also runs its package's ``__init__``, so that edge counts too. Read from the source with ``ast``; nothing is
imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[1] / "cosmos3_core"
PKG = "cosmos3_core"


def _modules() -> dict[str, Path]:
    out = {}
    for path in CORE.rglob("*.py"):
        parts = list(path.relative_to(CORE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def import_graph() -> dict[str, set[str]]:
    """module → the package modules it imports (directly, or as the package ``__init__`` of what it imports)."""
    modules = _modules()
    packages = {m for m, p in modules.items() if p.name == "__init__.py"}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for mod, path in modules.items():
        tree = ast.parse(path.read_text())
        skip = _type_checking_nodes(tree)
        here = mod.split(".") if mod in packages else mod.split(".")[:-1]
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.append(sub if sub in modules else source)
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            for target in targets:
                if target.split(".")[0] != PKG:
                    continue
                while target not in modules:
                    target = target.rpartition(".")[0]
                parts = target.split(".")
                for k in range(2, len(parts) + 1):  # the package __init__s on the way (cosmos3_core's own excluded)
                    name = ".".join(parts[:k])
                    if name != mod and not mod.startswith(name + ".") and name in modules:
                        graph[mod].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_package_imports_without_a_cycle():
    graph = import_graph()
    assert len(graph) > 40 and sum(map(len, graph.values())) > 100  # the walk really saw the package
    assert cycles(graph) == []


def test_the_graph_walk_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# what each layer may import from the package (its own folder is always allowed)
ALLOWED = {
    "kernels": {"runtime"},
    "model": {"kernels", "runtime", "config", "defaults"},
    "vae": {"kernels", "runtime", "config", "defaults", "model"},
    "sampling": {"kernels", "runtime", "config", "defaults", "model", "vae"},
    "modes": {"kernels", "runtime", "config", "defaults", "model", "vae", "sampling", "pipeline", "request", "media"},
    "reasoner": {"kernels", "runtime", "config", "defaults", "model", "sampling"},
    "parallel": {"kernels", "runtime", "config", "defaults", "model", "vae", "sampling", "pipeline"},
    "testing": {"config", "defaults", "model", "vae"},
}


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") >= 1 else ""


def test_layers_only_import_layers_below_them():
    wrong = []
    for mod, deps in import_graph().items():
        layer = _layer(mod)
        if layer in ALLOWED:
            for dep in deps:
                if _layer(dep) not in ALLOWED[layer] | {layer}:
                    wrong.append(f"{mod} -> {dep}")
    assert wrong == []


def test_nothing_imports_the_cli_or_the_test_fixtures():
    """The CLI is the top of the package (only the ``python -m`` shims point at it); the tiny checkpoints are test
    fixtures that no library module uses."""
    shims = {f"{PKG}.generate", f"{PKG}.reason", f"{PKG}.tiny"}
    for mod, deps in import_graph().items():
        if not mod.startswith(f"{PKG}.cli") and mod not in shims:
            assert not any(d.startswith(f"{PKG}.cli") for d in deps), (mod, deps)
        if not mod.startswith(f"{PKG}.testing") and mod not in shims:
            assert not any(d.startswith(f"{PKG}.testing") for d in deps), (mod, deps)
