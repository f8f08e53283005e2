"""Rewrite references to ``trioforward/dispatch/``'s flat modules to their sub-packages.

The dispatch folder was split by concern (docs/architecture.md, "Packages"). Run
from the repository root, after merging a branch written against the flat layout,
to move any module still at the top and rewrite every import, dotted name and path::

    python tools/relayout_dispatch.py          # git mv + rewrite, idempotent

A new flat module it does not know stays where it is and is printed: place it by hand.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

PACKAGES = {
    "engines": "tenants fair_order fair prefix routing engines kinds health adapters admin",
    "attempts": "policy budget identity request tracing outcome attempts queueing drain hint dispatch types counts",
    "dialects": "dialect dialect_completions dialect_sglang dialect_vllm_tokens continue_shapes complete",
    "rollout": (
        "engine_control versions weights continue continuing continue_answer continue_chat"
        " continue_native continue_stream continue_substream continue_tokens stream_spans"
        " abort abort_answer abort_answer_native replay"
    ),
    "client": "client forwarding forward_stream sampling gating control",
}
WHERE = {f"_{m}": pkg for pkg, mods in PACKAGES.items() for m in mods.split()}
# Its git history is the point: it looks up the commit that added the old path.
SKIP = {"bench/tracing_cost.py", "tools/relayout_dispatch.py"}
SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".rst"}

_DOTTED = re.compile(r"\btrioforward\.dispatch\.(_[a-z_]+)\b")
_FROM = re.compile(r"\bfrom trioforward\.dispatch import (_[a-z_]+)")
_PATH = re.compile(r"\bdispatch/(_[a-z_]+)\b")


def _sub(pattern: re.Pattern[str], fmt: str, text: str) -> str:
    def one(m: re.Match[str]) -> str:
        pkg = WHERE.get(m.group(1))
        return fmt.format(pkg=pkg, mod=m.group(1)) if pkg else m.group(0)

    return pattern.sub(one, text)


def rewrite(text: str) -> str:
    text = _sub(_DOTTED, "trioforward.dispatch.{pkg}.{mod}", text)
    text = _sub(_FROM, "from trioforward.dispatch.{pkg} import {mod}", text)
    return _sub(_PATH, "dispatch/{pkg}/{mod}", text)


def main() -> int:
    root = Path("trioforward/dispatch")
    for mod, pkg in WHERE.items():
        old = root / f"{mod}.py"
        if old.exists():
            (root / pkg).mkdir(exist_ok=True)
            subprocess.run(["git", "mv", str(old), str(root / pkg / old.name)], check=True)
    files = subprocess.run(["git", "ls-files"], capture_output=True, text=True, check=True).stdout
    for name in files.split():
        path = Path(name)
        if name in SKIP or path.suffix not in SUFFIXES or not path.is_file():
            continue
        text = path.read_text()
        new = rewrite(text)
        if new != text:
            path.write_text(new)
    stray = sorted(p.name for p in root.glob("_*.py") if p.name != "__init__.py")
    if stray:
        print("not placed (move by hand, add to PACKAGES):", " ".join(stray))
    return 1 if stray else 0


if __name__ == "__main__":
    sys.exit(main())
