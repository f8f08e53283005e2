"""Guard of the pool's private hook into h11 (``trioforward/http/_h11_hooks.py``):
fails when the installed h11 no longer has the layout the hook reads."""

from __future__ import annotations

import h11

from trioforward.http._h11_hooks import header_list


def _response_headers(head: bytes) -> object:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "t")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(head)
    event = conn.next_event()
    assert type(event) is h11.Response
    return event.headers


def test_header_list_reads_h11_full_items_as_name_value_pairs() -> None:
    headers = _response_headers(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Request-ID: a\r\n"
        b"content-length: 2\r\nSet-Cookie: x\r\nSet-Cookie: y\r\n\r\n"
    )
    full_items = headers._full_items  # type: ignore[attr-defined]
    assert isinstance(full_items, list) and all(len(t) == 3 for t in full_items)
    pairs = header_list(headers)
    assert pairs == list(headers)  # type: ignore[call-overload]
    assert pairs[0] == (b"content-type", b"application/json")
    assert [v for n, v in pairs if n == b"set-cookie"] == [b"x", b"y"]
