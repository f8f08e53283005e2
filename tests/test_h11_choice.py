"""Which h11 each side speaks (trioforward/_h11.py): the compiled h11-mypyc when it is
importable, pure h11 under TRIOFORWARD_H11=pure, and the same choice for the pool, the
simulated engine and the front (Hypercorn's H11Protocol). Each case runs in a fresh
interpreter, because the choice is made once, at import."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

COMPILED_INSTALLED = importlib.util.find_spec("h11_mypyc") is not None

# Prints the h11 module of each party, after importing the front the way serve does.
_REPORT = """
import trioforward.server
import trioforward.http._pool as pool, trioforward.http._stream as stream
import trioforward.sim.core._http as sim, trioforward.server.front._tcpserver as front
import hypercorn.protocol.h11 as hypercorn_h11, trioforward._h11 as choice
print(choice.name, pool.h11.__name__, stream.h11.__name__, sim.h11.__name__,
      front.h11.__name__, hypercorn_h11.h11.__name__)
"""


def _run(code: str, value: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRIOFORWARD_H11"}
    if value is not None:
        env["TRIOFORWARD_H11"] = value
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.skipif(not COMPILED_INSTALLED, reason="h11-mypyc is not installed")
@pytest.mark.parametrize("value", [None, "auto", "compiled", " Compiled "])
def test_the_compiled_h11_is_used_everywhere_when_installed(value: str | None) -> None:
    done = _run(_REPORT, value)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["h11_mypyc"] * 6


def test_pure_is_used_everywhere_when_asked() -> None:
    done = _run(_REPORT, "pure")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["h11"] * 6


def test_pure_is_used_when_the_compiled_one_is_missing() -> None:
    # sys.modules[name] = None makes `import h11_mypyc` raise ImportError.
    missing = "import sys; sys.modules['h11_mypyc'] = None\n"
    done = _run(missing + _REPORT, None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["h11"] * 6
    done = _run(missing + "import trioforward._h11", "compiled")
    assert done.returncode != 0
    assert "TRIOFORWARD_H11=compiled but h11-mypyc is not installed" in done.stderr
    assert "pip install 'trioforward[speedups]'" in done.stderr


def test_a_bad_value_is_refused_naming_the_variable() -> None:
    done = _run("import trioforward._h11", "fast")
    assert done.returncode != 0
    assert "TRIOFORWARD_H11='fast': must be one of auto, pure, compiled" in done.stderr


@pytest.mark.skipif(not COMPILED_INSTALLED, reason="h11-mypyc is not installed")
def test_hypercorn_imported_first_keeps_its_h11_and_so_does_our_worker() -> None:
    # As under the plain `hypercorn` command: Hypercorn holds pure h11 before the
    # app is imported; the front (our worker included) stays on it, the pool and
    # the sim take the compiled one (they exchange no h11 objects with the front).
    done = _run("import hypercorn.protocol.h11\n" + _REPORT, None)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["h11_mypyc", "h11_mypyc", "h11_mypyc", "h11_mypyc", "h11", "h11"]
