"""The code's shape, read from its own imports: the top-level packages import one way, and no file imports itself
back through a circle (what must load without torch: tests/test_no_torch.py)."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Lowest first: a package may import only those before it (a function-level import counts too).
LAYERS = ("common", "kvtransfer", "prefill_worker", "decode_worker", "router", "scripts")


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the layered packages."""
    found = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path, name: str, known: dict[str, Path]) -> set[str]:
    """The project modules `path` imports, anywhere in it; `from a import b` names a.b when b is a module, else a.
    A package's own __init__, reached only because a submodule was imported, is not counted."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                if f"{base}.{alias.name}" in known:
                    out.add(f"{base}.{alias.name}")
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, name, known) for name, path in known.items()}


def test_top_level_packages_import_one_way():
    wrong = []
    for name, targets in graph().items():
        layer = LAYERS.index(name.split(".")[0])
        for target in targets:
            if LAYERS.index(target.split(".")[0]) > layer:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "imports against the layering " + " < ".join(LAYERS) + ":\n" + "\n".join(sorted(wrong))


def test_no_file_imports_itself_back_through_a_circle():
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert not cycles, f"files that import each other through a circle: {cycles}"


def test_the_checks_see_a_two_way_import(tmp_path, monkeypatch):
    """The checks above fail on what they are meant to catch (a pair of packages and a pair of files)."""
    for package, body in (("common", "from router import x\n"), ("router", "import common.y\n")):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "common" / "y.py").write_text("from router import x\n")
    (tmp_path / "router" / "x.py").write_text("from common import y\n")
    for package in LAYERS[1:]:
        (tmp_path / package).mkdir(exist_ok=True)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match="common.y imports router.x"):
        test_top_level_packages_import_one_way()
    with pytest.raises(AssertionError, match="common.y.*router.x"):
        test_no_file_imports_itself_back_through_a_circle()
