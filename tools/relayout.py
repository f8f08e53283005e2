"""Move the flat modules of ``trioforward/dispatch/``, ``server/`` and ``sim/`` into
their sub-packages and rewrite every reference to them (docs/architecture.md, "Packages").

Run from the repository root, e.g. after merging branches written against the flat
layout::

    python tools/relayout.py                    # check only: what would move; exit 1 if unplaced
    python tools/relayout.py --apply            # git mv + rewrite; running it again changes nothing
    python tools/relayout.py --apply --place server/_new=admin   # place a module LAYOUT lacks
    python tools/relayout.py --apply --by-prefix                 # or place each by its suggestion

A flat module that :data:`LAYOUT` does not place stops the run before anything changes
(exit 2), listed with a suggested ``--place`` (the sub-package of the known module whose
name shares the longest prefix with it). Rewritten, in every tracked text file:
``trioforward.server._x`` wherever it appears (imports, ``mock.patch`` and
``monkeypatch.setattr`` targets, ``"module:attr"`` specs, importlib names),
``from trioforward.server import _x, _y, name`` (split by sub-package), relative imports
in ``trioforward/`` that reach a moved module or sit in one, and paths ``server/_x``
(docs, comments, config; not ``tests/server/_x``). Changed Python files get ruff's
import sorting. Needs git and ruff.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

# package -> sub-package -> its modules (without the leading underscore), lowest first.
LAYOUT: dict[str, dict[str, str]] = {
    "dispatch": {
        "engines": "tenants fair_order fair prefix routing engines kinds health adapters admin",
        "attempts": "policy budget identity request tracing outcome attempts queueing drain hint"
        " dispatch types counts",
        "dialects": "dialect dialect_completions dialect_sglang dialect_vllm_tokens continue_shapes"
        " complete",
        "rollout": "engine_control versions weights continue continuing continue_answer"
        " continue_chat continue_native continue_stream continue_substream continue_tokens"
        " stream_spans abort abort_answer abort_answer_native replay",
        "client": "client forwarding forward_stream sampling gating control",
    },
    "server": {
        "base": "errors state validate callers",
        "telemetry": "metrics metrics_box metrics_tenants tracing span_export",
        "front": "gc h11front leanstream appchannel tcpserver worker asgi auth outcome",
        "tinker": "",  # a sub-package before the split
        "admin": "admin_routes abort fleet_calls router_compat admin_log",
        "engine_api": "",  # a sub-package before the split
        "proxy": "forward native native_abort sessions served_model timing",
        "app": "app routes serve cli supervisor",
    },
    "sim": {
        "model": "generate errors api stream",
        "core": "http stats faults rl adapters",
        "physics": "physics kv prefix_cache scheduler timing",
        "routes": "completions native vllm_tokens token_routes tokenize weight_push metrics"
        " sglang_generate sglang_info sglang_lora sglang_openai",
        "engine": "engine open cli",
    },
}
ROOT = Path("trioforward")
# Its git history is the point: it looks up the commit that added the old path.
SKIP = {"bench/tracing_cost.py", "tools/relayout.py"}
SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".rst", ".json"}
_MOD = r"_[a-z0-9_]+"


def placement(extra: dict[tuple[str, str], str]) -> dict[str, dict[str, str]]:
    """package -> {module: sub-package}: LAYOUT, ``--place``, then what already sits in a
    sub-package (so a reference merged in later still finds a module placed earlier)."""
    where: dict[str, dict[str, str]] = {}
    for package, subs in LAYOUT.items():
        mods = {f"_{m}": sub for sub, names in subs.items() for m in names.split()}
        for sub in (sub for sub, names in subs.items() if names):  # made by the split
            for path in sorted((ROOT / package / sub).glob("_*.py")):
                mods.setdefault(path.stem, sub)
        mods.update({m: sub for (pkg, m), sub in extra.items() if pkg == package})
        where[package] = mods
    return where


def flat(package: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / package).glob("_*.py") if not p.name.startswith("__"))


def suggest(package: str, module: str) -> str:
    """The sub-package of the placed module sharing the longest ``_``-separated prefix."""

    def shared(name: str) -> int:
        n = 0
        for a, b in zip(module.strip("_").split("_"), name.split("_"), strict=False):
            if a != b:
                break
            n += 1
        return n

    known = [
        (shared(name), sub) for sub, names in LAYOUT[package].items() for name in names.split()
    ]
    return max(known, key=lambda found: found[0])[1]


def _absolute(match: re.Match[str], path: Path, where: dict[str, dict[str, str]]) -> str:
    """``from .x import y`` in ``path`` as an absolute import, if it reaches a split package."""
    indent, dots, rest = match.group(1), match.group(2), match.group(3)
    base = list(path.with_suffix("").parts[:-1])[: len(path.parts) - len(dots)]
    target = ".".join(base + ([rest] if rest else []))
    parts = target.split(".")
    moving = path.parent.parent == ROOT and path.stem in where.get(path.parent.name, {})
    if (
        len(parts) >= 2
        and parts[1] in where
        and (moving or len(parts) == 2 or parts[2] in where[parts[1]])
    ):
        return f"{indent}from {target} import "
    return match.group(0)


def _split_from(match: re.Match[str], package: str, mods: dict[str, str]) -> str:
    """``from trioforward.<package> import a, _b, _c`` -> one import per sub-package."""
    indent, body, tail = match.group(1), match.group(2) or match.group(3), match.group(4) or ""
    names = [n.split("#")[0].strip() for n in re.split(r",|\n", body)]
    groups: dict[str, list[str]] = {}
    for name in filter(None, names):
        groups.setdefault(mods.get(name.split(" as ")[0].strip(), ""), []).append(name)
    if set(groups) == {""}:
        return match.group(0)
    lines = [
        f"{indent}from trioforward.{package}{'.' + sub if sub else ''} import {', '.join(found)}{tail}"
        for sub, found in sorted(groups.items())
    ]
    return "\n".join(lines)


def rewrite(text: str, where: dict[str, dict[str, str]]) -> str:
    """``text`` with every reference to a flat module of ``where`` made to its sub-package."""
    for package, mods in where.items():
        text = _rewrite_package(text, package, mods)
    return text


def _rewrite_package(text: str, package: str, mods: dict[str, str]) -> str:
    def sub(m: re.Match[str], fmt: str) -> str:
        return fmt.format(mods[m.group(1)], m.group(1)) if m.group(1) in mods else m.group(0)

    dotted = rf"\btrioforward\.{package}\.({_MOD})\b"
    text = re.sub(dotted, lambda m: sub(m, f"trioforward.{package}.{{}}.{{}}"), text)
    names = r"(?:\(([^)]*)\)|([^\n#(]+?))([ \t]*#.*)?$"
    from_package = rf"(?m)^([ \t]*)from trioforward\.{package} import {names}"
    text = re.sub(from_package, lambda m: _split_from(m, package, mods), text)
    path = rf"(?<![\w-])(?<!tests/){package}/({_MOD})\b"
    return re.sub(path, lambda m: sub(m, f"{package}/{{}}/{{}}"), text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--apply", action="store_true", help="move and rewrite (default: check only)"
    )
    parser.add_argument(
        "--place",
        action="append",
        default=[],
        metavar="PKG/_MOD=SUB",
        help="put a module LAYOUT does not know, e.g. server/_quota=proxy",
    )
    parser.add_argument(
        "--by-prefix", action="store_true", help="place each unknown module as suggested"
    )
    args = parser.parse_args(argv)
    extra: dict[tuple[str, str], str] = {}
    for item in args.place:
        spec, _, sub = item.partition("=")
        package, _, module = spec.partition("/")
        if package not in LAYOUT or sub not in LAYOUT[package] or not module.startswith("_"):
            parser.error(f"--place {item}: want PKG/_MOD=SUB, a sub-package of {sorted(LAYOUT)}")
        extra[(package, module.removesuffix(".py"))] = sub
    where = placement(extra)
    unplaced = [(pkg, m) for pkg in LAYOUT for m in flat(pkg) if m not in where[pkg]]
    if unplaced and args.by_prefix:
        extra.update({(pkg, m): suggest(pkg, m) for pkg, m in unplaced})
        where, unplaced = placement(extra), []
    if unplaced:
        print("relayout: modules no sub-package is given (nothing was changed):", file=sys.stderr)
        for pkg, m in unplaced:
            print(f"  {pkg}/{m}.py   --place {pkg}/{m}={suggest(pkg, m)}", file=sys.stderr)
        print(
            "place each with --place (or take every suggestion with --by-prefix), and add it"
            " to LAYOUT in tools/relayout.py",
            file=sys.stderr,
        )
        return 2
    moves = [(pkg, m, where[pkg][m]) for pkg in LAYOUT for m in flat(pkg)]
    for pkg, m, sub in moves:
        print(f"{'move' if args.apply else 'would move'} {ROOT}/{pkg}/{m}.py -> {pkg}/{sub}/")
    if not args.apply:
        return 0
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout
    texts = [Path(n) for n in files.split() if n not in SKIP and Path(n).suffix in SUFFIXES]
    for path in texts:  # relative imports first, while each file is still where it was written
        if path.suffix == ".py" and path.parts[0] == ROOT.name and path.is_file():
            _write(path, _relative_only(path, where))
    for pkg, m, sub in moves:
        folder = ROOT / pkg / sub
        folder.mkdir(exist_ok=True)
        if not (folder / "__init__.py").exists():  # a sub-package LAYOUT names but no commit made
            (folder / "__init__.py").write_text(
                f'"""trioforward.{pkg}.{sub} (docs/architecture.md)."""\n'
            )
            subprocess.run(["git", "add", str(folder / "__init__.py")], check=True)
        subprocess.run(
            ["git", "mv", str(ROOT / pkg / f"{m}.py"), str(folder / f"{m}.py")], check=True
        )
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout
    changed = []
    for name in files.split():
        path = Path(name)
        if name in SKIP or path.suffix not in SUFFIXES or not path.is_file():
            continue
        if _write(path, rewrite(path.read_text(), where)) and path.suffix == ".py":
            changed.append(name)
    if changed:
        subprocess.run(
            [sys.executable, "-m", "ruff", "check", "--select", "I", "--fix", "--quiet", *changed],
            check=False,
        )
    print(f"relayout: {len(moves)} modules moved, {len(changed)} Python files rewritten")
    return 0


def _relative_only(path: Path, where: dict[str, dict[str, str]]) -> str:
    pattern = r"(?m)^(\s*)from (\.+)([\w.]*) import "
    return re.sub(pattern, lambda m: _absolute(m, path, where), path.read_text())


def _write(path: Path, new: str) -> bool:
    if new == path.read_text():
        return False
    path.write_text(new)
    return True


if __name__ == "__main__":
    sys.exit(main())
