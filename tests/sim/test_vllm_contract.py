"""The simulated engine answers as vLLM 0.32 does (docs/compatibility.md).

Every probe of vllm_probes.py is sent to a simulated engine set up like the
real one it was recorded from; the answer's outline (status, content type,
field names and nesting, value types, error type/param/code/message, plain-text
bodies, stream chunk layout — vllm_shapes.py) must equal the recorded one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from vllm_probes import FIXTURES, MAX_MODEL_LEN, MODEL, PROBES, Probe
from vllm_shapes import answer_outline, load_fixture, same_outline

from trioforward.sim import SimEngine, open_engine

DIR = "/tmp/adapters"  # the sim reads no files; under /tmp as the recorded one (paths → <path>)


@pytest.fixture
async def sims(fd_baseline: int) -> AsyncIterator[dict[str, SimEngine]]:
    """One simulated engine per recorded engine, configured the same way."""
    common = {"models": (MODEL,), "max_model_len": MAX_MODEL_LEN}
    async with (
        open_engine(runtime_lora=False, scale_out=True, **common) as base,  # type: ignore[arg-type]
        open_engine(
            adapters={"res1": f"{DIR}/resolver/res1"},
            lazy_adapters=0,
            missing_paths={f"{DIR}/not_an_adapter"},
            **common,  # type: ignore[arg-type]
        ) as lora,
    ):
        yield {"base": base, "lora": lora}


async def _ask(client: httpx.AsyncClient, engine: SimEngine, probe: Probe) -> dict[str, object]:
    content = None if probe.body is None else probe.content(DIR)
    reply = await client.request(probe.method, engine.url + probe.path, content=content)
    content_type = reply.headers.get("content-type")
    streamed = probe.stream and reply.status_code == 200
    if streamed:
        body: object = reply.text
    elif content_type == "application/json":
        body = orjson.loads(reply.content)
    else:
        body = reply.text
    return answer_outline(reply.status_code, content_type, body, streamed)


async def test_the_sim_answers_every_probe_as_vllm_did(sims: dict[str, SimEngine]) -> None:
    checked = 0
    async with httpx.AsyncClient() as client:
        for probe in PROBES:
            # In order: later LoRA probes depend on the state earlier ones leave
            # (a skipped probe changed nothing on vLLM either: it failed there).
            if probe.sim is not None:
                continue
            mine = await _ask(client, sims[probe.engine], probe)
            recorded = load_fixture(FIXTURES, probe.name)
            assert same_outline(mine, recorded), (probe.name, mine, recorded)
            checked += 1
    assert checked == sum(p.sim is None for p in PROBES)
    lora = sims["lora"].stats
    assert lora.adapter_loads == {"a1": 2, "a2": 1, "a3": 1, "res1": 1}
    assert lora.adapter_unloads == {"a2": 1} and lora.lazy_loads == {"res1": 1}


def test_every_probe_has_a_recorded_answer() -> None:
    names = {p.name for p in PROBES}
    recorded = {f.stem for f in FIXTURES.iterdir()}
    assert names == recorded
