"""Check a trioforward gateway against a live SGLang (docs/compatibility.md,
"Checking against a live SGLang"). Not part of CI: SGLang needs a GPU.

    python -m sglang.launch_server --model-path MODEL --port 30000 [--enable-lora ...]
    trioforward serve --engines http://127.0.0.1:30000 --port 8000
    python tools/check_sglang.py --engine http://127.0.0.1:30000 --gateway http://127.0.0.1:8000

Each check prints ``ok`` or ``FAIL`` with what differed; the exit status is the
number of failures. Greedy decoding (temperature 0) makes the gateway's answer
comparable with the engine's own:

1. ``GET /admin/engines`` says the engine is ``"kind": "sglang"`` with its token route;
2. ``POST /generate`` (one prompt, ``return_logprob``) through the gateway gives
   the engine's ``output_ids`` and logprobs, and the caller's ``rid``;
3. a batch (two prompts, list ``rid``) and ``n = 2`` keep SGLang's shapes;
4. a stream is cumulative and ends with ``data: [DONE]``, as direct;
5. an SGLang refusal (``sampling_params.seed``) comes back verbatim;
6. ``client.complete()`` (the ``/generate`` dialect) gives the same tokens;
7. a gateway pause with ``engine_mode: "keep"`` pauses SGLang (``/ready`` 503)
   and the engine is still healthy after two health intervals; resume;
8. ``/v1/completions`` with ``X-Request-Id`` reaches SGLang as the body's
   ``rid``: its answer's ``id`` is the engine-side id ``<X-Request-Id>.<n>``,
   its tokens the engine's own;
9. ``POST /admin/abort {"request_ids"}`` of a long ``/v1/completions`` ends it
   through ``/abort_request`` by that rid: 200, ``finish_reason: "abort"``,
   fewer tokens than asked (docs/operations.md, "Over-sampling: cancelling a round's stragglers");
10. ``POST /abort_request {"rid"}`` to the gateway with a long ``/generate``'s own
    ``rid`` ends it on SGLang by the engine-side id: 200 with an empty body, the
    answer ``finish_reason.type: "abort"``, fewer tokens than asked, ``meta_info.id``
    the caller's (docs/server.md, "Token routes");
11. ``GET /list_workers`` names the gateway (a slime-style abort comes back to it).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from typing import Any

PROMPT = [1, 2, 3, 4, 5]


def call(method: str, url: str, body: Any = None, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url, data=data, method=method, headers={"content-type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


class Checks:
    def __init__(self) -> None:
        self.failures = 0

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {name}{'' if ok else ': ' + detail}")
        self.failures += not ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", required=True, help="the SGLang server, http://host:port")
    parser.add_argument("--gateway", required=True, help="the gateway in front of it")
    parser.add_argument("--health-interval", type=float, default=5.0, help="the gateway's health_interval (s)")
    args = parser.parse_args()
    engine, gateway = args.engine.rstrip("/"), args.gateway.rstrip("/")
    c = Checks()

    _, body = call("GET", gateway + "/admin/engines")
    entry = next((e for e in json.loads(body)["engines"] if e["url"] == engine), None)
    c.check("kind detected", bool(entry) and entry["kind"] == "sglang" and entry["token_route"] is True, str(entry))

    one = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 8, "temperature": 0}, "return_logprob": True}
    _, direct = call("POST", engine + "/generate", {**one, "rid": "check-direct"})
    status, through = call("POST", gateway + "/generate", {**one, "rid": "check-gateway"})
    d, g = json.loads(direct), json.loads(through) if status == 200 else {}
    c.check("/generate tokens", status == 200 and g.get("output_ids") == d["output_ids"], through[:300].decode())
    c.check("/generate rid kept", g.get("meta_info", {}).get("id") == "check-gateway", str(g.get("meta_info")))
    dl = [e[0] for e in d["meta_info"].get("output_token_logprobs", [])]
    gl = [e[0] for e in g.get("meta_info", {}).get("output_token_logprobs", [])]
    c.check("/generate logprobs", len(dl) == len(gl) and all(abs(a - b) < 1e-3 for a, b in zip(dl, gl, strict=False)), f"{dl} vs {gl}")

    batch = {"input_ids": [PROMPT, PROMPT[:3]], "rid": ["b-one", "b-two"], "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    status, through = call("POST", gateway + "/generate", batch)
    items = json.loads(through) if status == 200 else []
    c.check("batch", [i["meta_info"]["id"] for i in items] == ["b-one", "b-two"], through[:300].decode())
    status, through = call("POST", gateway + "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "n": 2}})
    c.check("n = 2", status == 200 and isinstance(json.loads(through), list) and len(json.loads(through)) == 2, through[:300].decode())

    stream = {**one, "stream": True}
    _, direct = call("POST", engine + "/generate", stream)
    status, through = call("POST", gateway + "/generate", stream)
    events = [e for e in through.split(b"\n\n") if e]
    c.check("stream ends [DONE]", status == 200 and events[-1] == b"data: [DONE]", through[-200:].decode())
    last = json.loads(events[-2][6:]) if len(events) > 1 else {}
    want = json.loads([e for e in direct.split(b"\n\n") if e][-2][6:])
    c.check("stream output", last.get("output_ids") == want["output_ids"], str(last)[:300])

    refused = {"input_ids": PROMPT, "sampling_params": {"seed": 1}}
    ds, direct = call("POST", engine + "/generate", refused)
    gs, through = call("POST", gateway + "/generate", refused)
    c.check("engine refusal verbatim", (ds, direct) == (gs, through), f"{ds} {direct[:200]!r} vs {gs} {through[:200]!r}")

    import trio

    import trioforward

    model = json.loads(call("GET", engine + "/model_info")[1])["served_model_name"]

    async def complete() -> list[int]:
        async with trioforward.open_client(engines=[engine], engine_kind="sglang") as client:
            done = await client.complete(model=model, prompt=PROMPT, max_tokens=8, temperature=0.0)
            return done.choices[0].tokens.tolist()

    c.check("complete() via /generate", trio.run(complete) == d["output_ids"])

    status, _ = call("POST", gateway + "/admin/pause", {"engine_mode": "keep"})
    ready, _ = call("GET", engine + "/ready")
    time.sleep(2 * args.health_interval + 1)
    _, body = call("GET", gateway + "/admin/engines")
    entry = next(e for e in json.loads(body)["engines"] if e["url"] == engine)
    call("POST", gateway + "/admin/resume", {})
    c.check("pause keeps the engine", status == 200 and ready == 503 and entry["healthy"], f"{status} {ready} {entry}")

    v1 = {"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    _, direct = call("POST", engine + "/v1/completions", v1)
    status, through = call("POST", gateway + "/v1/completions", v1, {"X-Request-Id": "check-v1"})
    g = json.loads(through) if status == 200 else {}
    c.check("/v1 id is the body rid", str(g.get("id", "")).startswith("check-v1."), through[:300].decode())
    want = [ch.get("token_ids") for ch in json.loads(direct)["choices"]]
    c.check("/v1 tokens", [ch.get("token_ids") for ch in g.get("choices", [])] == want, through[:300].decode())

    import threading

    long = {**v1, "max_tokens": 4000, "ignore_eos": True}
    answer: list[tuple[int, bytes]] = []
    worker = threading.Thread(target=lambda: answer.append(call("POST", gateway + "/v1/completions", long, {"X-Request-Id": "check-abort"})))
    worker.start()
    time.sleep(1.0)  # decoding by now
    status, counts = call("POST", gateway + "/admin/abort", {"request_ids": ["check-abort"]})
    worker.join(60)
    got = json.loads(answer[0][1]) if answer and answer[0][0] == 200 else {}
    choice = (got.get("choices") or [{}])[0]
    c.check(
        "/v1 abort by rid",
        status == 200 and json.loads(counts).get("on_engine") == 1 and choice.get("finish_reason") == "abort"
        and len(choice.get("token_ids") or []) < 4000,
        f"{counts[:200]!r} {str(got)[:300]}",
    )

    native = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True}, "rid": "check-native"}
    answer.clear()
    worker = threading.Thread(target=lambda: answer.append(call("POST", gateway + "/generate", native)))
    worker.start()
    time.sleep(1.0)  # decoding by now
    status, body = call("POST", gateway + "/abort_request", {"rid": "check-native"})
    worker.join(60)
    got = json.loads(answer[0][1]) if answer and answer[0][0] == 200 else {}
    meta = got.get("meta_info") or {}
    c.check(
        "/generate abort by the caller's rid",
        (status, body) == (200, b"") and (meta.get("finish_reason") or {}).get("type") == "abort"
        and len(got.get("output_ids") or []) < 4000 and meta.get("id") == "check-native",
        f"{status} {body[:100]!r} {str(got)[:300]}",
    )
    status, body = call("GET", gateway + "/list_workers")
    urls = json.loads(body).get("urls") if status == 200 else None
    c.check("/list_workers names the gateway", urls == [gateway.rstrip("/")], f"{status} {body[:200]!r}")
    return c.failures


if __name__ == "__main__":
    sys.exit(main())
