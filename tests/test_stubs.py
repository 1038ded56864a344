"""The hand-written stub must name exactly what the Rust module exports."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import taskwarden
from taskwarden import _core

STUB = Path(taskwarden.__file__).with_name("_core.pyi")


def _stub_tree() -> ast.Module:
    return ast.parse(STUB.read_text())


def test_stub_names_match_the_module() -> None:
    names: set[str] = set()
    for node in _stub_tree().body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    public = {n for n in dir(_core) if not n.startswith("_") or n == "__version__"}
    assert names == public


def test_stub_all_matches_the_module() -> None:
    """``mypy.stubtest`` compares ``__all__`` too: a stub without the
    module's list failed it."""
    (stub_all,) = (
        node.value
        for node in _stub_tree().body
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == ["__all__"]
    )
    assert sorted(ast.literal_eval(stub_all)) == sorted(_core.__all__)


def test_stub_methods_match_the_class() -> None:
    cls = next(
        n for n in _stub_tree().body if isinstance(n, ast.ClassDef) and n.name == "LedgerCore"
    )
    stubbed = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)} - {"__new__"}
    actual = {n for n in dir(_core.LedgerCore) if not n.startswith("_")}
    assert stubbed == actual


def _stub_shape(node: ast.FunctionDef) -> list[tuple[str, str, bool]]:
    """(name, "positional" or "keyword", has a default) per parameter."""
    args = node.args
    positional = [a for a in args.posonlyargs + args.args if a.arg not in ("self", "cls")]
    defaults = [False] * (len(positional) - len(args.defaults)) + [True] * len(args.defaults)
    shape = [(a.arg, "positional", d) for a, d in zip(positional, defaults, strict=True)]
    shape += [
        (a.arg, "keyword", d is not None)
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    return shape


def _runtime_shape(obj: object) -> list[tuple[str, str, bool]]:
    keyword = inspect.Parameter.KEYWORD_ONLY
    return [
        (p.name, "keyword" if p.kind is keyword else "positional", p.default is not p.empty)
        for p in inspect.signature(obj).parameters.values()  # type: ignore[arg-type]
        if p.name != "self"
    ]


def _stubbed_callables() -> list[tuple[ast.FunctionDef, object]]:
    pairs: list[tuple[ast.FunctionDef, object]] = []
    for node in _stub_tree().body:
        if isinstance(node, ast.FunctionDef):
            pairs.append((node, getattr(_core, node.name)))
        elif isinstance(node, ast.ClassDef) and node.name == "LedgerCore":
            for method in node.body:
                # A property is an attribute at run time, with no signature.
                is_property = isinstance(method, ast.FunctionDef) and any(
                    isinstance(d, ast.Name) and d.id == "property" for d in method.decorator_list
                )
                if isinstance(method, ast.FunctionDef) and not is_property:
                    # The constructor's signature is the class's own.
                    is_new = method.name == "__new__"
                    runtime = _core.LedgerCore if is_new else getattr(_core.LedgerCore, method.name)
                    pairs.append((method, runtime))
    return pairs


def test_stub_signatures_match_the_runtime() -> None:
    """Names, keyword-only markers and defaults: a call written to the stub
    must work at run time."""
    pairs = _stubbed_callables()
    assert len(pairs) > 25
    for node, runtime in pairs:
        assert _stub_shape(node) == _runtime_shape(runtime), node.name
