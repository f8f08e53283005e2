"""The docs cannot drift from the code: the configuration reference is generated,
and every page the README and the docs index link to exists."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from trioforward import knobs

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools import gen_config_doc  # noqa: E402


def test_configuration_reference_matches_settings() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == gen_config_doc.render(), (
        "docs/configuration.md is stale: run `python -m tools.gen_config_doc`"
    )


def test_configuration_reference_names_every_knob_with_flag_env_default_unit() -> None:
    text = gen_config_doc.render()
    for knob in knobs():
        row = next(line for line in text.splitlines() if line.startswith(f"| [`{knob.name}`]"))
        assert knob.env in row
        assert "(no flag)" not in row, f"{knob.name} has no `trioforward serve` flag"
        assert row.count("|") == 6  # knob, flag, env, default, unit


def test_relative_links_in_readme_and_docs_resolve() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name} links to missing {target}"


def test_embedding_page_shows_the_tested_example_verbatim() -> None:
    page = (ROOT / "docs" / "embedding.md").read_text()
    example = (ROOT / "examples" / "embedded_trainer.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    assert example in blocks, "docs/embedding.md must contain examples/embedded_trainer.py verbatim"


# Sources whose docstrings and comments may point into docs/.
_CODE = [
    *sorted((ROOT / "trioforward").rglob("*.py")),
    *sorted((ROOT / "tests").rglob("*.py")),
    *sorted((ROOT / "bench").glob("*.py")),
    *sorted((ROOT / "tools").glob("*.py")),
    *sorted((ROOT / "examples").glob("*.py")),
]
_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# What is not in the repository: the design notes it was started from, issue
# numbers, files outside the tree. Spelt in pieces so this file does not match.
_OUTSIDE = re.compile("|".join([r"DESI" + r"GN\b", r"\bissue" + r" \d+", r"engine_" + r"api\.md", r"/wor" + r"k/", r"shared/" + r"reference"]))
_DOCS_REF = re.compile(r'docs/([\w.-]+\.md)(?:,\s*"([^"]+)")?')


def _headings(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {m.group(1).strip() for m in re.finditer(r"^#+\s+(.+)$", text, flags=re.M)}


def test_nothing_points_outside_the_repository() -> None:
    found = []
    for path in [*_CODE, *_PAGES]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _OUTSIDE.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "point at docs/ pages instead:\n" + "\n".join(found)


def test_docs_references_in_code_name_existing_pages_and_sections() -> None:
    broken = []
    for path in _CODE:
        text = path.read_text()
        for match in _DOCS_REF.finditer(text):
            page, section = match.group(1), match.group(2)
            # A reference may wrap over lines (and comment markers).
            section = " ".join(w for w in (section or "").split() if w != "#")
            target = ROOT / "docs" / page
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"
            if not target.exists():
                broken.append(f"{where}: no page docs/{page}")
            elif section and section not in _headings(target):
                broken.append(f'{where}: docs/{page} has no section "{section}"')
    assert not broken, "\n".join(broken)
