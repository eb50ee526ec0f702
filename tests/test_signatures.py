"""Parameter lists stay short: no function of the pack takes more than 10 parameters, except a node's ``execute``,
whose parameters are exactly its schema's inputs (ComfyUI V3 calls it with one keyword per input; more than 10 is
then the node's widgets, not a loose list).

Read from the source with ``ast`` (``self``/``cls`` not counted; ``*args``/``**kwargs`` count one each); the node
half compares each long ``execute`` with the schema the real host loads.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 10


def _long_functions() -> list[tuple[str, int, str, list[str], bool]]:
    """(file, line, name, named parameters, has ``**kwargs``) of every function over ``LIMIT`` parameters."""
    out = []
    for path in sorted([*(ROOT / "cosmos3_core").rglob("*.py"), *(ROOT / "nodes").glob("*.py"), ROOT / "__init__.py"]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.arg not in ("self", "cls")]
            if len(names) + (a.vararg is not None) + (a.kwarg is not None) > LIMIT:
                out.append((str(path.relative_to(ROOT)), node.lineno, node.name, names, a.kwarg is not None))
    return out


def test_no_function_over_ten_parameters_but_node_execute():
    offenders = [f"{f}:{line} {name}" for f, line, name, *_ in _long_functions()
                 if not (f.startswith("nodes/") and name == "execute")]
    assert not offenders, f"more than {LIMIT} parameters (group them in a value object): {offenders}"


@pytest.mark.comfy
def test_a_long_node_execute_takes_exactly_its_schema_inputs(host):
    by_file = {}
    for cls in host.node_class_mappings.values():
        if cls.__module__.split(".")[-2:-1] == ["nodes"] and "execute" in cls.__dict__:
            by_file.setdefault(cls.__module__.rsplit(".", 1)[-1], []).append(cls)
    checked = 0
    for f, _line, _name, names, has_kwargs in _long_functions():
        if not f.startswith("nodes/"):
            continue
        classes = [c for c in by_file.get(Path(f).stem, [])
                   if [p for p in inspect.signature(inspect.unwrap(c.execute.__func__)).parameters
                       if p != "cls"][:len(names)] == names]
        assert len(classes) == 1, f"{f}: no single node class owns the execute({names})"
        inputs = [i.id for i in classes[0].define_schema().inputs]
        assert set(names) <= set(inputs), f"{f}: execute parameters that are not inputs: {set(names) - set(inputs)}"
        rest = set(inputs) - set(names)
        assert not rest or has_kwargs, f"{f}: inputs execute does not take: {rest}"
        checked += 1
    assert checked >= 1  # the nodes with many widgets (sampler, long video, …) are checked, not skipped
