"""`trioforward demo --engine URL` against both live vLLM servers: no request fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import Server


def test_demo_against_real_engines(vllm_base: Server, vllm_lora: Server, tmp_path: Path) -> None:
    out = tmp_path / "demo.json"
    argv = [
        sys.executable, "-m", "trioforward", "demo",
        "--engine", vllm_base.url, "--engine", vllm_lora.url,
        "--duration", "10", "--burst", "64", "--json", str(out),
    ]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(out.read_text())
    print(done.stdout[-1500:])
    assert summary["failures"] == 0 and summary["ok"]
    assert summary["succeeded"] > 0
