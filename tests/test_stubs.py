"""The hand-written stub must name exactly what the Rust module exports."""

from __future__ import annotations

import ast
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


def test_stub_methods_match_the_class() -> None:
    cls = next(
        n for n in _stub_tree().body if isinstance(n, ast.ClassDef) and n.name == "LedgerCore"
    )
    stubbed = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)} - {"__init__"}
    actual = {n for n in dir(_core.LedgerCore) if not n.startswith("_")}
    assert stubbed == actual
