"""One engine-URL rule: the settings, ``client.engines.add`` and ``POST /admin/engines``
accept and refuse the same URLs, and a refusal says what is wrong with the URL."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from gateway_harness import Gateway

from trioforward import open_client
from trioforward._settings import Settings, SettingsError

GOOD = [
    ("http://127.0.0.1:8001", "http://127.0.0.1:8001"),
    ("http://127.0.0.1:8005/", "http://127.0.0.1:8005"),
    ("HTTP://127.0.0.1:8002", "http://127.0.0.1:8002"),
    ("http://[::1]:8003", "http://[::1]:8003"),
    ("http://localhost", "http://localhost"),
    ("http://127.0.0.1:8004/engine-a", "http://127.0.0.1:8004/engine-a"),
]

# (url, words the refusal must contain)
BAD = [
    ("http://h:8001/v1", "drop the trailing /v1"),
    ("http://h:8001/v1/", "drop the trailing /v1"),
    ("http://h:8001/v1?x=1", "query or fragment"),
    ("http://h:8001?x=1", "query or fragment"),
    ("http://h:8001#frag", "query or fragment"),
    ("https://h:8001", "scheme 'https'"),
    ("ftp://h", "scheme 'ftp'"),
    ("h:8001", "no scheme"),
    ("http://:8001", "no host"),
    ("http://h:abc", "port 'abc'"),
    ("http://h:0", "port 0"),
    ("http://h:70000", "port '70000'"),
    ("http://h:", "empty port"),
    ("http://user:pw@h:8001", "credentials"),
    ("http://h :8001", "whitespace"),
    ("http://[::1", "cannot be parsed"),
    ("", "not a URL"),
]


@pytest.mark.parametrize(("url", "why"), BAD)
def test_settings_refuse_with_the_reason(url: str, why: str) -> None:
    with pytest.raises(SettingsError, match="'engines'") as info:
        Settings(engines=(url,))
    assert why in str(info.value)


@pytest.mark.parametrize(("url", "normal"), GOOD)
def test_settings_accept(url: str, normal: str) -> None:
    assert Settings(engines=(url,)).engines == (url,)


async def test_client_engines_add_same_rule() -> None:
    async with open_client(health_interval=0) as client:
        for url, why in BAD:
            with pytest.raises(ValueError, match="engine URL") as info:
                client.engines.add(url)
            assert why in str(info.value), url
        assert len(client.engines) == 0
        for url, normal in GOOD:
            assert client.engines.add(url).url == normal
        assert [e.url for e in client.engines.list()] == [n for _, n in GOOD]


async def test_admin_engines_same_rule_and_says_what_is_wrong(
    engine: Any, gateway: Gateway
) -> None:
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        for url, why in BAD:
            response = await client.post("/admin/engines", json={"url": url})
            assert response.status_code == 400, url
            error = response.json()["error"]
            assert error["param"] == "url" and error["code"] == "invalid_engine_url"
            assert why in error["message"], (url, error["message"])
            assert "setting" not in error["message"]  # not the configuration's wording
        response = await client.post("/admin/engines", json={"url": 8001})
        assert response.status_code == 400 and "not a URL" in response.json()["error"]["message"]
        assert len(gateway.state.client.engines) == 1
        for url, normal in GOOD:
            response = await client.post("/admin/engines", json={"url": url})
            assert response.status_code == 201, url
            assert normal in [e["url"] for e in response.json()["engines"]]
        # Re-adding a registered engine changes nothing: 200, not 201.
        again = await client.post("/admin/engines", json={"url": engine.url + "/"})
        assert again.status_code == 200
        assert [e["url"] for e in again.json()["engines"]] == [engine.url] + [n for _, n in GOOD]
        for _, normal in GOOD:  # the test's engines are not reachable
            gone = await client.request("DELETE", "/admin/engines", params={"url": normal})
            assert gone.status_code == 200
