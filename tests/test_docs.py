"""The docs cannot drift from the code: the configuration reference is generated,
and every page the README and the docs index link to exists."""

from __future__ import annotations

import re
from pathlib import Path

from trioforward._demo import gen_config_doc
from trioforward._settings import knobs

ROOT = Path(__file__).resolve().parents[1]


def test_configuration_reference_matches_settings() -> None:
    committed = (ROOT / "docs" / "configuration.md").read_text()
    assert committed == gen_config_doc.render(), (
        "docs/configuration.md is stale: run `python -m trioforward._demo.gen_config_doc`"
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
