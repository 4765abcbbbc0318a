"""The rooms of DESIGN.md's layout: ``client`` never imports ``broker`` or
``bookie``; the servers never import the SDK (the wire vocabulary they share
with it, errors, entry format, topic names, hashing, service URLs, lives in
``proto``, as Pulsar's pulsar-common); ``proto`` imports neither side.

A static check of every ``import`` statement (``ast``), including the ones
inside functions. Also: no import cycle between modules at run time (imports
under ``if TYPE_CHECKING:`` are type-only and do not count; issue 12 item 5)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FORBIDDEN = {
    "client": ("broker", "bookie"),
    "broker": ("client",),
    "bookie": ("client", "broker"),
    "proto": ("client", "broker", "bookie"),
}


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of each absolute import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_only_what_its_room_allows(package):
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no modules under {package}/"
    wrong = [f"{path.relative_to(ROOT)}:{line} imports {top}"
             for path in files for line, top in imported_packages(path) if top in FORBIDDEN[package]]
    assert wrong == []


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from client.errors import Timeout\n    import broker.server\n")
    assert imported_packages(module) == [(2, "client"), (3, "broker")]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` (file ``path``) imports at run time:
    module level and inside functions, not under ``if TYPE_CHECKING:``;
    ``from pkg import sub`` counts as importing the submodule when it is one."""
    out: set[str] = set()

    def visit(node) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit_node(other)
                continue
            visit_node(child)

    def visit_node(node) -> None:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif target in known:
                    out.add(target)
        visit(node)

    visit(ast.parse(path.read_text(), str(path)))
    out.discard(module)
    return out


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def test_no_module_imports_itself_back_at_run_time():
    modules = {}
    for package in FORBIDDEN:
        for path in (ROOT / package).rglob("*.py"):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name[:-len(".__init__")] if name.endswith(".__init__") else name] = path
    known = set(modules)
    edges = {m: runtime_imports(m, p, known) for m, p in modules.items()}
    assert len(edges) > 100
    assert import_cycles(edges) == []


def test_the_cycle_check_finds_a_cycle_and_ignores_type_checking_imports(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b\n")
    b.write_text("def f():\n    import a\n")
    known = {"a", "b"}
    edges = {"a": runtime_imports("a", a, known), "b": runtime_imports("b", b, known)}
    assert edges == {"a": set(), "b": {"a"}} and import_cycles(edges) == []
    a.write_text("import b\n")
    edges["a"] = runtime_imports("a", a, known)
    assert import_cycles(edges) == [["a", "b"]]
