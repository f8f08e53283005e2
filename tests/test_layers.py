"""The folder layout is the architecture (docs/design.md, "Layers"): imports go down
only, and a package uses another package's public names, never its private modules."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "trioforward"
# Who may import whom (at run time; type-check-only imports are exempt).
BELOW = {
    "http": set(),
    "dispatch": {"http"},
    "fleet": {"dispatch", "http"},
    "sessions": {"dispatch", "http"},
    "server": {"sessions", "fleet", "dispatch", "http"},
    "sim": {"http"},
    "_demo": {"server", "sessions", "fleet", "dispatch", "http", "sim"},
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only.update(id(n) for n in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
    return found


def test_packages_import_down_only_and_only_public_names() -> None:
    wrong = []
    for package, allowed in BELOW.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, module in _imports(path):
                parts = module.split(".")
                if parts[0] != "trioforward" or len(parts) < 2 or parts[1] == package:
                    continue
                other = parts[1]
                where = f"{path.relative_to(ROOT.parent)}:{line}: {module}"
                if other in BELOW and other not in allowed:
                    wrong.append(f"{where} (imports up or sideways)")
                elif other in BELOW and any(p.startswith("_") for p in parts[2:]):
                    wrong.append(f"{where} (a private module of {other})")
    assert not wrong, "\n".join(wrong)


# Each split package's sub-packages, lowest first: each may import those before it
# only (docs/architecture.md, "Packages"; tools/relayout.py moves modules into them).
SUB_PACKAGES = {
    "dispatch": ["engines", "attempts", "dialects", "rollout", "client"],
    "server": ["base", "telemetry", "front", "tinker", "admin", "engine_api", "proxy", "app"],
    "sim": ["model", "core", "physics", "routes", "engine"],
}
FOLDER_LIMIT = 20  # modules directly in one folder (docs/architecture.md, "Packages")


def _targets(path: Path, package: str) -> list[tuple[int, str]]:
    """:func:`_imports`, with ``from trioforward.<package> import <sub-package>`` read
    as an import of that sub-package (it does not run the package's ``__init__`` names)."""
    found = []
    for line, module in _imports(path):
        if module == f"trioforward.{package}":
            tree = ast.parse(path.read_text())
            names = {
                alias.name
                for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.lineno == line and node.module == module
                for alias in node.names
            }
            if names and names <= set(SUB_PACKAGES[package]):
                found.extend((line, f"{module}.{name}") for name in sorted(names))
                continue
        found.append((line, module))
    return found


def upward_imports(root: Path, package: str) -> list[str]:
    """``path:line: module (why)`` for each run-time import in the sub-packages of
    ``root`` (the folder of ``trioforward.<package>``) that names a sub-package at or
    after its own in :data:`SUB_PACKAGES`, a module outside every sub-package, or
    the package itself (whose ``__init__`` imports the top sub-package)."""
    order = SUB_PACKAGES[package]
    wrong = []
    for rank, sub in enumerate(order):
        for path in sorted((root / sub).rglob("*.py")):
            for line, module in _targets(path, package):
                parts = module.split(".")
                if parts[:2] != ["trioforward", package]:
                    continue
                where = f"{path.relative_to(root.parent.parent)}:{line}: {module}"
                if len(parts) == 2:
                    wrong.append(f"{where} (the {package} package itself, from below)")
                elif parts[2] not in order:
                    wrong.append(f"{where} (a module outside {package}/'s sub-packages)")
                elif order.index(parts[2]) > rank:
                    wrong.append(f"{where} (imports up: {sub} is below {parts[2]})")
    return wrong


@pytest.mark.parametrize("package", sorted(SUB_PACKAGES))
def test_sub_packages_import_down_only(package: str) -> None:
    folder = ROOT / package
    found = sorted(p.name for p in folder.iterdir() if (p / "__init__.py").exists())
    assert found == sorted(SUB_PACKAGES[package])
    # Every module sits in a sub-package: one left at the top would be in no order.
    assert sorted(p.name for p in folder.glob("*.py")) == ["__init__.py"]
    for sub in SUB_PACKAGES[package]:
        doc = ast.get_docstring(ast.parse((folder / sub / "__init__.py").read_text())) or ""
        assert "May import" in doc or "may import" in doc or "imports no other" in doc, sub
    wrong = upward_imports(folder, package)
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("package", sorted(SUB_PACKAGES))
def test_an_upward_import_is_caught(tmp_path: Path, package: str) -> None:
    # The check above on a tree where the lowest sub-package imports the top one,
    # the package itself and a module at the top; the top one imports down.
    low, *_, top = SUB_PACKAGES[package]
    root = tmp_path / "trioforward" / package
    for sub in SUB_PACKAGES[package]:
        (root / sub).mkdir(parents=True)
        (root / sub / "__init__.py").write_text('"""x"""\n')
    (root / low / "_x.py").write_text(
        f"from trioforward.{package}.{low}._y import y\n"
        f"from trioforward.{package}.{top}._z import z\n"
        f"from trioforward.{package} import {top}\n"
        f"from trioforward.{package} import Thing\n"
        f"from trioforward.{package}._flat import w\n"
    )
    (root / top / "_z.py").write_text(
        f"from trioforward.{package}.{low}._x import x\nfrom trioforward.{package} import {low}\n"
    )
    wrong = upward_imports(root, package)
    assert [w.split(": ", 1)[0] for w in wrong] == [f"trioforward/{package}/{low}/_x.py:{n}" for n in (2, 3, 4, 5)]


def test_no_folder_holds_more_than_twenty_modules() -> None:
    crowded = {
        str(folder.relative_to(ROOT.parent)): n
        for folder in [ROOT, *(p for p in ROOT.rglob("*") if p.is_dir())]
        if (n := len(list(folder.glob("*.py")))) > FOLDER_LIMIT
    }
    assert not crowded, crowded


def test_the_pool_knows_nothing_of_queueing() -> None:
    # QUEUED is the dispatch layer's phase (waiting for engine capacity or a pause):
    # the enum lives outside http/, and no module of http/ names that phase.
    import trioforward
    import trioforward.http

    assert trioforward.http.Phase is trioforward.Phase
    assert trioforward.Phase.__module__ == "trioforward._phase"
    named = [p.name for p in sorted((ROOT / "http").rglob("*.py")) if "QUEUED" in p.read_text()]
    assert not named, f"http/ names the dispatch layer's QUEUED phase: {named}"
