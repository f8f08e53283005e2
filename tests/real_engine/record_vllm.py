"""Send the probes of tests/sim/vllm_probes.py to live vLLM servers and write their answers.

Used by test_recorded_answers.py on the session's fresh servers; with
``TRIOFORWARD_RECORD_FIXTURES=1`` (`TRIOFORWARD_RECORD_FIXTURES=1 nox -s
real_engine`) the answers replace tests/sim/vllm_0_32_fixtures/, which is how
the simulated engine's contract is refreshed for a newer vLLM
(docs/compatibility.md).

Files: ``NAME.json`` = ``{"status", "content_type", "body"}`` (body parsed JSON,
or the text); a stream probe ``NAME.txt`` = ``HTTP STATUS``, the response
headers as JSON, a blank line, the raw body. The model directory's path is
written as ``<dir>``.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from vllm_probes import PROBES


def record(
    urls: dict[str, str], directory: Path, out: Path, names: set[str] | None = None
) -> list[str]:
    """Run every probe (those in ``names``, if given) in order against
    ``urls[probe.engine]``; returns the names written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    with httpx.Client(timeout=120) as client:
        for probe in PROBES:
            if names is not None and probe.name not in names:
                continue
            content = None if probe.body is None else probe.content(str(directory))
            headers = {} if content is None else {"content-type": "application/json"}
            reply = client.request(
                probe.method, urls[probe.engine] + probe.path, content=content, headers=headers
            )
            text = reply.text.replace(str(directory), "<dir>")
            for stale in (out / f"{probe.name}.json", out / f"{probe.name}.txt"):
                stale.unlink(missing_ok=True)
            if probe.stream:
                head = json.dumps({k: v for k, v in reply.headers.items() if k != "date"})
                (out / f"{probe.name}.txt").write_text(f"HTTP {reply.status_code}\n{head}\n\n{text}")
            else:
                content_type = reply.headers.get("content-type")
                body = json.loads(text) if content_type == "application/json" else text
                answer = {"status": reply.status_code, "content_type": content_type, "body": body}
                (out / f"{probe.name}.json").write_text(json.dumps(answer, indent=2) + "\n")
            written.append(probe.name)
    return written
