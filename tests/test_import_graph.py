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


# The floors of the package, bottom to top (cosmos3_core/__init__.py and docs/architecture.md state the same order):
# every room — a folder, or a top-level module — imports only rooms on lower floors.
FLOORS = [
    {"runtime", "defaults", "config", "media"},  # per-run options, defaults and constants, the config, media files
    {"kernels"},  # attention, GEMV, compile caches
    {"model"},  # the Mixture-of-Transformers and its weights
    {"vae", "sampling", "testing"},  # the VAEs; prompts, conditioning, the plan, the loop; tiny test checkpoints
    {"request", "reasoner"},  # the vocabulary of a run; the reasoner
    {"pipeline"},  # the stages on a loaded checkpoint
    {"modes", "parallel"},  # the modes; the parallel engine
    {"checks"},  # the checks of a request's values (the resolver's, and nobody else's)
    {"resolve"},  # the resolver: every default and user-facing check, once
    {"api"},  # the front door: generate a whole Request
    {"cli"},  # the command lines
    {"generate", "reason", "tiny"},  # the python -m shims
]
FLOOR = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def _room(module: str) -> str:
    """The folder (or top-level module) a module lives in; the package itself is ``""``."""
    return module.split(".")[1] if module.count(".") >= 1 else ""


def arrows_up(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a room to a room on the same floor or above it (the package ``__init__`` aside)."""
    wrong = []
    for mod, deps in graph.items():
        here = _room(mod)
        for dep in deps:
            there = _room(dep)
            if there and there != here and FLOOR[there] >= FLOOR[here]:
                wrong.append(f"{mod} -> {dep}")
    return sorted(wrong)


def test_every_room_has_a_floor():
    rooms = {_room(m) for m in import_graph()} - {""}
    assert rooms == set(FLOOR), (sorted(rooms - set(FLOOR)), sorted(set(FLOOR) - rooms))


def test_no_import_runs_up_a_floor():
    assert arrows_up(import_graph()) == []


def test_the_floor_check_finds_a_planted_arrow_up():
    planted = {"cosmos3_core.pipeline": {"cosmos3_core.resolve"}, "cosmos3_core.model.fp8": {"cosmos3_core.sampling.plan"},
               "cosmos3_core.modes.clip": {"cosmos3_core.parallel.run"}, "cosmos3_core.resolve": {"cosmos3_core.checks"}}
    assert arrows_up(planted) == ["cosmos3_core.model.fp8 -> cosmos3_core.sampling.plan",
                                  "cosmos3_core.modes.clip -> cosmos3_core.parallel.run",
                                  "cosmos3_core.pipeline -> cosmos3_core.resolve"]


def test_the_package_docstring_states_the_floors():
    """The layer order the package docstring gives is the one this test holds the code to."""
    import cosmos3_core

    doc = cosmos3_core.__doc__
    positions = [min(doc.find(f"``{room}") for room in rooms if f"``{room}" in doc) for rooms in FLOORS[:-1]]
    assert -1 not in positions and positions == sorted(positions), positions


def test_nothing_imports_the_cli_or_the_test_fixtures():
    """The CLI is the top of the package (only the ``python -m`` shims point at it); the tiny checkpoints are test
    fixtures that no library module uses."""
    shims = {f"{PKG}.generate", f"{PKG}.reason", f"{PKG}.tiny"}
    for mod, deps in import_graph().items():
        if not mod.startswith(f"{PKG}.cli") and mod not in shims:
            assert not any(d.startswith(f"{PKG}.cli") for d in deps), (mod, deps)
        if not mod.startswith(f"{PKG}.testing") and mod not in shims:
            assert not any(d.startswith(f"{PKG}.testing") for d in deps), (mod, deps)
