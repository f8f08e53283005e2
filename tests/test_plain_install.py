"""``pip install .`` with no extras gives an embedding trainer the client and nothing
of the server: in a fresh virtual environment (no system site-packages), the core
imports ``trioforward.open_client`` and runs examples/embedded_trainer.py, and no
web framework is installed.

Uses pip's cache and whatever index pip is configured with (CI installs the test
dependencies the same way); about 30-60 s, most of it pip."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_NO_SERVER = (
    "import importlib.util as u, trioforward; "
    "assert callable(trioforward.open_client); "
    "missing = [m for m in ('hypercorn', 'quart', 'quart_trio', 'prometheus_client', 'click', "
    "'rich', 'httpx') if u.find_spec(m) is None]; "
    "print(' '.join(missing))"
)


@pytest.mark.timeout(900)
def test_core_install_runs_the_embedded_example_without_the_server(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "trioforward", source / "trioforward", ignore=ignore)
    shutil.copytree(ROOT / "examples", source / "examples", ignore=ignore)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = str(env_dir / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}

    def run(*args: str, cwd: Path = tmp_path) -> str:
        done = subprocess.run(
            [python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}\n{done.stderr[-4000:]}"
        return done.stdout

    run("-m", "pip", "install", "--quiet", str(source))
    assert sys.prefix != str(env_dir)
    missing = run("-c", _NO_SERVER).split()
    assert missing == ["hypercorn", "quart", "quart_trio", "prometheus_client", "click", "rich", "httpx"]
    out = run(str(source / "examples" / "embedded_trainer.py"), "--steps", "2")
    assert "step 1:" in out and "retries 0" in out
    command = subprocess.run(
        [str(env_dir / "bin" / "trioforward"), "serve"], env=env, capture_output=True, text=True
    )
    assert command.returncode == 2 and "trioforward[server]" in command.stderr
