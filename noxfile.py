"""nox sessions: tests, lint, typecheck, bench."""

from __future__ import annotations

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """Run the test suite in the current environment (install with `pip install -e .[test]`)."""
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "trioforward", "tests", "bench")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test]", "mypy")
    session.run("mypy", "trioforward")


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """Every benchmark at a 2-core size; writes bench/results/*.json, PNGs and docs/performance.md."""
    session.run("python", "-m", "bench.run_all", *session.posargs)
