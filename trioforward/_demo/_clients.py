"""The real clients the demo drives the gateway with.

- the official ``openai`` SDK (completions, chat, streaming) and the official
  ``tinker`` SDK (base model and a LoRA adapter) — both are synchronous and run
  their own threads, so they run in worker threads (``trio.to_thread``) and stop
  when a ``threading.Event`` is set;
- an RL-trainer-like loop over ``httpx.AsyncClient`` under trio (token-id
  prompts, ``n`` samples, logprobs);
- a burst of thousands of concurrent requests through trioforward's own
  connection pool (the lightest client we have, so the gateway is what is
  measured on a 2-core machine).

Every function records each request in the :class:`Tally`; a request counts as a
success only when its answer has what the API promises.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import orjson
import trio

from trioforward._demo._tally import Tally

__all__ = ["openai_worker", "tinker_worker", "trainer_loop", "burst", "check_completion"]

# Small, realistic generations: with the fleet's per-token decode time this
# makes engine time visible next to queue time.
MAX_TOKENS = 16


def check_completion(body: dict[str, Any], n: int = 1) -> str | None:
    """Why a ``/v1/completions`` or chat answer is not a real result, or None if it is."""
    choices = body.get("choices")
    if not isinstance(choices, list) or len(choices) != n:
        return f"expected {n} choices, got {choices!r:.200}"
    for choice in choices:
        if choice.get("finish_reason") not in ("stop", "length"):
            return f"finish_reason {choice.get('finish_reason')!r}"
    return None


def import_sdks() -> None:
    """Import the ``openai`` and ``tinker`` SDKs (seconds on a busy 2-core machine).

    The demo does this before its clock starts, so a short ``--duration`` is
    spent driving the gateway, not importing: otherwise an SDK thread could still
    be importing when the traffic stops, and its client would make no request.
    """
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    import openai  # noqa: F401
    import tinker  # noqa: F401


def openai_worker(base_url: str, model: str, tally: Tally, stop: threading.Event, index: int) -> None:
    """Loop completions, chat and streaming completions with the ``openai`` SDK until ``stop``.

    ``max_retries=0``: the SDK must not hide a gateway failure behind its own retry.
    """
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-demo", max_retries=0, timeout=120.0)
    kinds = ("openai completions", "openai chat", "openai stream")
    step = index
    try:
        while not stop.is_set():
            kind = kinds[step % len(kinds)]
            step += 1
            start = tally.now()
            try:
                error = _openai_call(client, kind, model, step, tally)
            except openai.APIError as exc:
                error = f"{type(exc).__name__}: {exc}"
                if kind == "openai stream" and getattr(exc, "code", None) == "aborted":
                    # A weight-update pause (engine_mode abort) ended this stream after
                    # its first bytes: streams are never replayed, the client resubmits.
                    tally.note("streams resubmitted after the pause")
                    try:
                        error = _openai_call(client, kind, model, step, tally)
                    except Exception as again:
                        error = f"{type(again).__name__}: {again}"
            except Exception as exc:  # every SDK error is a failed request
                error = f"{type(exc).__name__}: {exc}"
            tally.record(kind, start, error is None, error)
    finally:
        client.close()


def _note_continued(tally: Tally, choices: list[dict[str, Any]]) -> None:
    """Count answers a weight update continued (``weight_versions`` with more than
    one span) and the tokens kept: decoded before the last update, not again."""
    for choice in choices:
        spans = choice.get("weight_versions") or []
        if len(spans) > 1:
            tally.note("answers continued")
            tally.note("tokens kept by continuing", int(spans[-1]["start"]))


def _openai_call(client: Any, kind: str, model: str, step: int, tally: Tally) -> str | None:
    if kind == "openai completions":
        result = client.completions.create(
            model=model, prompt=f"Question {step}: why is the sky blue?", max_tokens=MAX_TOKENS, seed=step
        )
        body = result.model_dump()
        _note_continued(tally, body["choices"])
        return check_completion(body)
    if kind == "openai chat":
        result = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": f"Say something about trio, take {step}."}],
            max_tokens=MAX_TOKENS,
            seed=step,
        )
        return check_completion(result.model_dump())
    # A stream is complete only if a chunk carried a finish_reason: the SDK
    # stops quietly when a stream is cut, so ending the loop proves nothing.
    finish = None
    chunks = 0
    for chunk in client.completions.create(
        model=model, prompt=f"Count to {step}:", max_tokens=MAX_TOKENS, seed=step, stream=True
    ):
        chunks += 1
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
        _note_continued(tally, chunk.model_dump()["choices"])
    if finish not in ("stop", "length"):
        return f"stream ended after {chunks} chunks without a finish_reason"
    return None


def tinker_worker(
    base_url: str,
    base_model: str,
    model_path: str | None,
    tally: Tally,
    stop: threading.Event,
    errors: list[str],
) -> None:
    """Sample with the official ``tinker`` SDK from ``base_model`` and from ``model_path``.

    Submits a handful of samples (2 sequences each) per round from each sampling
    client, then waits for all of them, until ``stop``. Set-up errors go to
    ``errors`` (and count as one failure).
    """
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    import tinker
    from tinker import types

    start = tally.now()
    try:
        service = tinker.ServiceClient(base_url=base_url, api_key="tml-demo")
    except Exception as exc:
        errors.append(f"tinker ServiceClient: {exc}")
        tally.record("tinker base", start, False, f"ServiceClient: {exc}")
        return
    with service:
        clients: list[tuple[str, Any]] = []
        targets = [("tinker base", {"base_model": base_model})]
        if model_path is not None:
            targets.append(("tinker lora", {"model_path": model_path}))
        for api, kwargs in targets:
            start = tally.now()
            try:
                clients.append((api, service.create_sampling_client(**kwargs).result()))  # type: ignore[arg-type]
            except Exception as exc:
                errors.append(f"{api} create_sampling_client: {exc}")
                tally.record(api, start, False, f"create_sampling_client: {type(exc).__name__}: {exc}")
        seed = 0
        # At least one round even if the run is already over (a slow first import
        # of the SDK on a fresh install can take that long): the demo must show it.
        while clients:
            pending = []
            for api, sampler in clients:
                for _ in range(4):
                    seed += 1
                    params = types.SamplingParams(max_tokens=MAX_TOKENS, seed=seed, temperature=1.0)
                    prompt = types.ModelInput.from_ints([1 + seed % 50, 2, 3, 4, 5, 6, 7, 8])
                    start = tally.now()
                    try:
                        pending.append((api, start, sampler.sample(prompt, num_samples=2, sampling_params=params)))
                    except Exception as exc:
                        tally.record(api, start, False, f"{type(exc).__name__}: {exc}")
            for api, start, future in pending:
                try:
                    response = future.result(timeout=120)
                    lengths = [len(seq.tokens) for seq in response.sequences]
                    error = None if len(lengths) == 2 and min(lengths) > 0 else f"sequences {lengths}"
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                tally.record(api, start, error is None, error)
            if stop.is_set():
                break


async def trainer_loop(
    client: Any, base_url: str, model: str, tally: Tally, stop: trio.Event, index: int, api: str = "trainer (httpx)"
) -> None:
    """An RL trainer's sampling loop: token-id prompts, ``n=4``, logprobs, one session each.

    ``client`` is an ``httpx.AsyncClient``. Runs until ``stop`` is set.
    """
    step = 0
    while not stop.is_set():
        step += 1
        body = {
            "model": model,
            "prompt": [index % 97 + 1, step % 89 + 1, 7, 8, 9, 10],
            "max_tokens": MAX_TOKENS,
            "n": 4,
            "seed": index * 100_000 + step,
            "logprobs": 1,
            "return_token_ids": True,
        }
        start = tally.now()
        try:
            response = await client.post(
                base_url + "/v1/completions", json=body, headers={"X-Session-ID": f"trainer-{index}"}
            )
            if response.status_code != 200:
                error: str | None = f"HTTP {response.status_code}: {response.text[:200]}"
            else:
                error = check_completion(response.json(), n=4)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        tally.record(api, start, error is None, error)


async def burst(base_url: str, model: str, n: int, tally: Tally, api: str = "burst") -> None:
    """``n`` concurrent ``/v1/completions`` at once, each on its own connection."""
    from trioforward.http import open_pool

    url = base_url + "/v1/completions"
    headers = [("Content-Type", "application/json")]

    async def one(i: int, pool: Any) -> None:
        content = orjson.dumps({"model": model, "prompt": [i % 1000 + 1, 2, 3], "max_tokens": MAX_TOKENS, "seed": i})
        start = tally.now()
        try:
            response = await pool.request("POST", url, headers=headers, content=content)
            if response.status != 200:
                error: str | None = f"HTTP {response.status}: {response.content[:200]!r}"
            else:
                error = check_completion(orjson.loads(response.content))
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        tally.record(api, start, error is None, error)

    async with open_pool(max_connections=0) as pool, trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(one, i, pool)
