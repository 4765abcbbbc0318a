"""The rooms of DESIGN.md's layout: ``client`` never imports ``broker`` or
``bookie``; the servers never import the SDK (the wire vocabulary they share
with it, errors, entry format, topic names, hashing, service URLs, lives in
``proto``, as Pulsar's pulsar-common); ``proto`` imports neither side.

A static check of every ``import`` statement (``ast``), including the ones
inside functions."""
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
