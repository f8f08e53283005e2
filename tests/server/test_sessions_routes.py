"""The session routes and their refusals (docs/sessions.md, "Trajectories", "Errors"):
each bad input a clear 4xx, no engine generation for it, nothing of the session lost;
chat requests a session cannot serve are forwarded as before."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import httpx
import orjson
from gateway_harness import Gateway, open_gateway

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "sessions"))
from renderers import model_dir  # noqa: E402

KEYS = {"a": "sk-sessions-a-0123456789", "b": "sk-sessions-b-9876543210"}
TENANTS = {"a": {"keys": [KEYS["a"]]}, "b": {"keys": [KEYS["b"]]}}


def _turn(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "model": "sim-base",
        "messages": messages,
        "max_tokens": 4,
        "return_token_ids": True,
        **extra,
    }


def _generations(engine: Any) -> int:
    return int(
        engine.stats.by_path["/v1/completions"] + engine.stats.by_path["/v1/chat/completions"]
    )


async def test_unknown_ended_and_bad_ids(gateway: Gateway, engine: Any) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        unknown = await client.get("/v1/sessions/nobody")
        end_unknown = await client.delete("/v1/sessions/nobody")
        reward_unknown = await client.post("/v1/sessions/nobody/reward", json={"reward": 1})
        bad_id = await client.post(
            "/v1/chat/completions",
            json=_turn([{"role": "user", "content": "x"}]),
            headers={"X-Session-Id": "a b"},
        )
        first = await client.post(
            "/v1/chat/completions",
            json=_turn([{"role": "user", "content": "x"}]),
            headers={"X-Session-Id": "s1"},
        )
        ended = await client.delete("/v1/sessions/s1")
        after = await client.get("/v1/sessions/s1")
    for reply in (unknown, end_unknown, reward_unknown, after):
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "session_not_found"
    assert bad_id.status_code == 400 and bad_id.json()["error"]["code"] == "invalid_session_id"
    assert first.status_code == 200
    assert (
        ended.status_code == 200 and len(ended.json()["turns"]) == 1
    )  # the trajectory, at its end
    assert _generations(engine) == 1


async def test_untokenizable_and_unservable_turns_lose_nothing(
    gateway: Gateway, engine: Any
) -> None:
    head = {"X-Session-Id": "s2"}
    messages = [{"role": "user", "content": "go"}]
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        never = await client.post(
            "/v1/chat/completions", json=_turn([{"role": "user", "content": 7}]), headers=head
        )
        none_left = await client.get("/v1/sessions/s2")
        one = (await client.post("/v1/chat/completions", json=_turn(messages), headers=head)).json()
        messages.append(one["choices"][0]["message"])
        forced = await client.post(
            "/v1/chat/completions",
            json=_turn([*messages, {"role": "user", "content": "x"}], tool_choice="required"),
            headers=head,
        )
        two_n = await client.post(
            "/v1/chat/completions",
            json=_turn([*messages, {"role": "user", "content": "x"}], n=2),
            headers=head,
        )
        bad = await client.post(
            "/v1/chat/completions",
            json=_turn([*messages, {"role": "user", "content": {"no": 1}}]),
            headers=head,
        )
        good = (
            await client.post(
                "/v1/chat/completions",
                json=_turn([*messages, {"role": "user", "content": "next"}]),
                headers=head,
            )
        ).json()
    assert never.status_code == 400 and never.json()["error"]["code"] == "render_failed"
    assert "/tokenize answered 400" in never.json()["error"]["message"]
    assert none_left.status_code == 404  # a first turn that failed leaves no session
    # Not session turns: forwarded to the engine's chat route as before, not recorded.
    assert forced.status_code == 200 and "session" not in forced.json()
    assert two_n.status_code == 200 and len(two_n.json()["choices"]) == 2
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "render_failed"
    # The refused turns changed nothing: the next one extends turn 0.
    p1, t1 = one["prompt_token_ids"], one["choices"][0]["token_ids"]
    assert good["session"]["turn"] == 1 and not good["session"]["branch"]
    assert good["prompt_token_ids"][: len(p1) + len(t1)] == p1 + t1
    assert _generations(engine) == 4 and engine.stats.by_path["/v1/chat/completions"] == 2


async def test_rewards_and_the_jsonl_export(gateway: Gateway, engine: Any) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        for sid in ("r1", "r2"):
            await client.post(
                "/v1/chat/completions",
                json=_turn([{"role": "user", "content": sid}]),
                headers={"X-Session-Id": sid},
            )
        whole = await client.post("/v1/sessions/r1/reward", json={"reward": 1.5})
        named = await client.post("/v1/sessions/r1/reward", json={"reward": 0, "name": "format"})
        turn = await client.post("/v1/sessions/r1/reward", json={"reward": 0.25, "turn": 0})
        no_turn = await client.post("/v1/sessions/r1/reward", json={"reward": 1, "turn": 3})
        not_number = await client.post("/v1/sessions/r1/reward", json={"reward": "high"})
        misspelt = await client.post("/v1/sessions/r1/reward", json={"rewrd": 1})
        not_json = await client.post("/v1/sessions/r1/reward", content=b"{")
        export = await client.get("/v1/sessions")
    assert whole.status_code == named.status_code == turn.status_code == 200
    assert turn.json() == {
        "id": "r1",
        "rewards": {"reward": 1.5, "format": 0.0},
        "turn_rewards": [0.25],
    }
    assert no_turn.status_code == 400 and no_turn.json()["error"]["code"] == "invalid_turn"
    for reply in (not_number, misspelt, not_json):
        assert reply.status_code == 400
    assert export.headers["content-type"].startswith("application/jsonl")
    lines = [orjson.loads(line) for line in export.content.splitlines()]
    assert [t["id"] for t in lines] == ["r1", "r2"]
    assert (
        lines[0]["rewards"] == {"reward": 1.5, "format": 0.0}
        and lines[0]["turns"][0]["reward"] == 0.25
    )
    assert _generations(engine) == 2


async def test_another_tenants_session_is_not_found(engine: Any) -> None:
    def auth(tenant: str, sid: str | None = None) -> dict[str, str]:
        head = {"Authorization": f"Bearer {KEYS[tenant]}"}
        return head if sid is None else {**head, "X-Session-Id": sid}

    async with (
        open_gateway(engine.url, tenants=TENANTS) as gw,
        httpx.AsyncClient(base_url=gw.url) as client,
    ):
        mine = await client.post(
            "/v1/chat/completions",
            json=_turn([{"role": "user", "content": "a"}]),
            headers=auth("a", "shared"),
        )
        theirs = await client.get("/v1/sessions/shared", headers=auth("b"))
        reward = await client.post(
            "/v1/sessions/shared/reward", json={"reward": 1}, headers=auth("b")
        )
        end = await client.delete("/v1/sessions/shared", headers=auth("b"))
        export = await client.get("/v1/sessions", headers=auth("b"))
        no_key = await client.get("/v1/sessions/shared")
        kept = await client.get("/v1/sessions/shared", headers=auth("a"))
        assert await gw.pool_active() == 0
    assert mine.status_code == 200
    for reply in (theirs, reward, end):
        assert reply.status_code == 404 and reply.json()["error"]["code"] == "session_not_found"
    assert export.status_code == 200 and export.content == b""
    assert no_key.status_code == 401
    assert kept.status_code == 200 and kept.json()["tenant"] == "a" and kept.json()["rewards"] == {}


async def test_a_local_template_error_is_a_clear_400(engine: Any, tmp_path: Path) -> None:
    strict = (
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
        "{{ raise_exception('Conversation roles must be user or assistant') }}{% endif %}"
        "{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    )
    directory = model_dir(tmp_path, strict)
    async with (
        open_gateway(engine.url, session_tokenizer=str(directory)) as gw,
        httpx.AsyncClient(base_url=gw.url) as client,
    ):
        refused = await client.post(
            "/v1/chat/completions",
            json=_turn([{"role": "tool", "content": "x"}]),
            headers={"X-Session-Id": "t"},
        )
        served = await client.post(
            "/v1/chat/completions",
            json=_turn([{"role": "user", "content": "You fix"}]),
            headers={"X-Session-Id": "t"},
        )
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "render_failed"
    assert "Conversation roles must be user or assistant" in refused.json()["error"]["message"]
    assert served.status_code == 200
    # Rendered in the gateway: the engine got the local tokenizer's ids and no /tokenize.
    assert engine.stats.by_path["/tokenize"] == 0 and list(engine.stats.prompts) == [
        served.json()["prompt_token_ids"]
    ]


async def test_with_chat_sessions_off_the_header_only_routes(engine: Any) -> None:
    async with (
        open_gateway(engine.url, chat_sessions=False) as gw,
        httpx.AsyncClient(base_url=gw.url) as client,
    ):
        head = {"X-Session-Id": "routing-only"}
        answer = await client.post(
            "/v1/chat/completions", json=_turn([{"role": "user", "content": "x"}]), headers=head
        )
        session = await client.get("/v1/sessions/routing-only")
    assert answer.status_code == 200 and "session" not in answer.json()
    assert session.status_code == 404
    assert (
        engine.stats.by_path["/v1/chat/completions"] == 1 and engine.stats.by_path["/tokenize"] == 0
    )
