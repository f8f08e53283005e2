"""The folder layout is the architecture (docs/design.md, "Layers"): imports go down
only, and a package uses another package's public names, never its private modules."""

from __future__ import annotations

import ast
from pathlib import Path

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


# dispatch/'s own sub-packages, lowest first: each may import those before it only.
DISPATCH = ["engines", "attempts", "dialects", "rollout", "client"]
FOLDER_LIMIT = 20  # modules directly in one folder (docs/architecture.md, "Packages")


def upward_dispatch_imports(root: Path) -> list[str]:
    """``path:line: module (why)`` for each run-time import in ``root``'s sub-packages
    that names a sub-package at or after its own in :data:`DISPATCH`, or the
    ``trioforward.dispatch`` package itself (whose ``__init__`` imports the client)."""
    wrong = []
    for rank, package in enumerate(DISPATCH):
        for path in sorted((root / package).rglob("*.py")):
            for line, module in _imports(path):
                parts = module.split(".")
                if parts[:2] != ["trioforward", "dispatch"]:
                    continue
                where = f"{path.relative_to(root.parent.parent)}:{line}: {module}"
                if len(parts) == 2:
                    wrong.append(f"{where} (the dispatch package itself, from below)")
                elif parts[2] in DISPATCH and DISPATCH.index(parts[2]) > rank:
                    wrong.append(f"{where} (imports up: {package} is below {parts[2]})")
    return wrong


def test_dispatch_sub_packages_import_down_only() -> None:
    found = sorted(p.name for p in (ROOT / "dispatch").iterdir() if (p / "__init__.py").exists())
    assert found == sorted(DISPATCH)
    wrong = upward_dispatch_imports(ROOT / "dispatch")
    assert not wrong, "\n".join(wrong)


def test_an_upward_import_is_caught(tmp_path: Path) -> None:
    # The check above on a tree with one import from engines up to rollout.
    root = tmp_path / "trioforward" / "dispatch"
    for package in DISPATCH:
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text('"""x"""\n')
    (root / "engines" / "_x.py").write_text(
        "from trioforward.dispatch.attempts._request import Request\n"
        "from trioforward.dispatch.rollout._replay import replaying_request\n"
    )
    (root / "client" / "_y.py").write_text("from trioforward.dispatch.engines._engines import Engine\n")
    wrong = upward_dispatch_imports(root)
    assert len(wrong) == 2 and all("trioforward/dispatch/engines/_x.py" in w for w in wrong)


def test_no_dispatch_folder_holds_more_than_twenty_modules() -> None:
    dispatch = ROOT / "dispatch"
    crowded = {
        str(folder.relative_to(ROOT.parent)): n
        for folder in [dispatch, *(p for p in dispatch.rglob("*") if p.is_dir())]
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
