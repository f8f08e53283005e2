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


def test_the_pool_knows_nothing_of_queueing() -> None:
    # QUEUED is the dispatch layer's phase (waiting for engine capacity or a pause):
    # the enum lives outside http/, and no module of http/ names that phase.
    import trioforward
    import trioforward.http

    assert trioforward.http.Phase is trioforward.Phase
    assert trioforward.Phase.__module__ == "trioforward._phase"
    named = [p.name for p in sorted((ROOT / "http").rglob("*.py")) if "QUEUED" in p.read_text()]
    assert not named, f"http/ names the dispatch layer's QUEUED phase: {named}"
