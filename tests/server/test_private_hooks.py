"""Guards of the server's private hooks into Hypercorn 0.18 (``server/front/_tcpserver.py``,
``server/front/_appchannel.py``, ``server/front/_h11front.py``, ``server/front/_leanstream.py``).

Each hook re-implements or calls Hypercorn code that is not its public API. These
tests fail loudly when the installed Hypercorn differs from the one the hooks
were written against, instead of the hooks silently costing an extra scheduler
pass or a second write. When one fails after an upgrade: read the new Hypercorn
code named in the failure, bring the hook module up to date (its docstring lists
what it relies on), then record the new fingerprint here.

The behaviour each hook buys is asserted by tests/server/test_worker_writes.py
(one write per fixed-length response, no scheduler pass per write once the
request is read), tests/server/test_keepalive.py (keep-alive as a read deadline)
tests/server/test_appchannel.py (the disconnect hook), tests/server/test_front_framing.py
and tests/server/test_front_pipelined.py (the refused framings, the re-implemented
``_handle_events``: must-close requests, chunk lines, the head limit), tests/server/test_must_close.py (the shielded close) and
tests/server/test_worker_vs_hypercorn.py (the lean stream: the same scope, messages and
bytes as stock Hypercorn).
"""

from __future__ import annotations

import hashlib
import inspect
import re
from importlib import metadata
from typing import Any

import h11
import hypercorn.config as hypercorn_config
import hypercorn.protocol.h11 as h11_protocol
import hypercorn.protocol.http_stream as http_stream
import hypercorn.trio.task_group as task_group
import hypercorn.trio.tcp_server as tcp_server
import hypercorn.utils as hypercorn_utils
import pytest
from hypercorn.protocol import ProtocolWrapper
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import HTTPStream

from trioforward import _h11
from trioforward.server.front import _appchannel, _h11front, _leanstream, _tcpserver

# sha256 (first 16 hex digits) of the source of each Hypercorn function the hooks
# copy, override, call or depend on, as of Hypercorn 0.18.0.
FINGERPRINTS = {
    "TCPServer.__init__": (tcp_server.TCPServer.__init__, "4c1d42457bc197b2"),
    "TCPServer.run": (tcp_server.TCPServer.run, "fd34b021d1a86c98"),
    "TCPServer.protocol_send": (tcp_server.TCPServer.protocol_send, "225856426bff7be0"),
    "TCPServer._read_data": (tcp_server.TCPServer._read_data, "7ca747d922c65cf1"),
    "TCPServer._close": (tcp_server.TCPServer._close, "bc73c4ae25a1ceec"),
    "TCPServer._idle_timeout": (tcp_server.TCPServer._idle_timeout, "210ce1014d98e1cb"),
    "TCPServer._initiate_server_close": (
        tcp_server.TCPServer._initiate_server_close,
        "7c1b548a65adc8b1",
    ),
    "TrioSingleTask": (tcp_server.TrioSingleTask, "aa59316c028b876a"),
    "ProtocolWrapper.__init__": (ProtocolWrapper.__init__, "df25e181b9e2e64d"),
    "H11Protocol.__init__": (H11Protocol.__init__, "c7c989fd6a352626"),
    "H11Protocol._handle_events": (H11Protocol._handle_events, "bd4a76b2837e8722"),
    "H11Protocol._create_stream": (H11Protocol._create_stream, "a2338a57ab343908"),
    "H11Protocol._send_error_response": (H11Protocol._send_error_response, "58c2b47ae295d000"),
    "H11Protocol._send_h11_event": (H11Protocol._send_h11_event, "5e40283daa303ec7"),
    "HTTPStream.app_send": (HTTPStream.app_send, "c806044b99736985"),
    "TaskGroup.__init__": (task_group.TaskGroup.__init__, "ecd9faf5832ee0e8"),
    "TaskGroup.__aenter__": (task_group.TaskGroup.__aenter__, "38047eb0284cdaa6"),
    "TaskGroup.spawn_app": (task_group.TaskGroup.spawn_app, "b4c1131427529801"),
    "task_group._handle": (task_group._handle, "06081a56a9930825"),
    # _leanstream.py too (_handle_events, _create_stream and _send_h11_event above):
    # what it keeps (parsing, recycling) and what it re-implements.
    "H11Protocol.handle": (h11_protocol.H11Protocol.handle, "3b56e067447488df"),
    "H11Protocol.stream_send": (h11_protocol.H11Protocol.stream_send, "56a36254a368d71a"),
    "H11Protocol._check_protocol": (h11_protocol.H11Protocol._check_protocol, "f95f6b38f43c62aa"),
    "H11Protocol._maybe_recycle": (h11_protocol.H11Protocol._maybe_recycle, "3ac53f52bc4e65de"),
    "H11Protocol._close_stream": (h11_protocol.H11Protocol._close_stream, "378930655d7bb41a"),
    "HTTPStream.__init__": (http_stream.HTTPStream.__init__, "c51a65fea53dbfeb"),
    "HTTPStream.handle": (http_stream.HTTPStream.handle, "6ed2e34c5e708c6a"),
    "HTTPStream._send_closed": (http_stream.HTTPStream._send_closed, "9aaf2e1ac611e51c"),
    "HTTPStream._send_error_response": (http_stream.HTTPStream._send_error_response, "57f849b2813e5779"),
    "utils.build_and_validate_headers": (hypercorn_utils.build_and_validate_headers, "0d636273d7dc86a3"),
    "utils.suppress_body": (hypercorn_utils.suppress_body, "21eb6cd69f3c0cd7"),
    "utils.valid_server_name": (hypercorn_utils.valid_server_name, "b710f1b8668c9870"),
    "Config.response_headers": (hypercorn_config.Config.response_headers, "5a637c3d48180e55"),
}


def _fingerprint(obj: Any) -> str:
    return hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16]


def test_hypercorn_is_the_pinned_minor_version() -> None:
    assert metadata.version("hypercorn").startswith("0.18."), (
        "the server's private hooks were written against Hypercorn 0.18 "
        "(pyproject.toml pins it); see this module's docstring"
    )


@pytest.mark.parametrize("name", sorted(FINGERPRINTS))
def test_hypercorn_code_the_hooks_rely_on_is_unchanged(name: str) -> None:
    obj, expected = FINGERPRINTS[name]
    assert _fingerprint(obj) == expected, (
        f"Hypercorn's {name} changed: check trioforward/server/front/_tcpserver.py, "
        f"_appchannel.py, _h11front.py and _leanstream.py against it, then update FINGERPRINTS"
    )


def test_tcp_server_attributes_the_hooks_use() -> None:
    server = object.__new__(tcp_server.TCPServer)
    tcp_server.TCPServer.__init__(server, None, None, None, None, None)  # type: ignore[arg-type]
    for name in ("app", "config", "context", "send_lock", "idle_task", "stream", "state"):
        assert hasattr(server, name), f"TCPServer no longer sets {name}"
    for method in ("restart", "stop"):
        assert callable(getattr(server.idle_task, method)), f"idle_task lost {method}()"
    for name in ("_read_data", "_close", "_idle_timeout", "_initiate_server_close"):
        assert callable(getattr(tcp_server.TCPServer, name)), f"TCPServer lost {name}"
    # The subclass still overrides what it means to.
    assert _tcpserver.KeepAliveTCPServer.run is not tcp_server.TCPServer.run
    assert _tcpserver.KeepAliveTCPServer.protocol_send is not tcp_server.TCPServer.protocol_send
    assert _tcpserver.KeepAliveTCPServer._close is not tcp_server.TCPServer._close


def test_h11_protocol_hooks_the_front_refusals_use() -> None:
    # _h11front.FrontH11Protocol is built with ProtocolWrapper's arguments minus the
    # ALPN protocol, and its _send_error_response reads the exception being handled.
    params = list(inspect.signature(H11Protocol.__init__).parameters)
    assert params == [
        "self", "app", "config", "context", "task_group", "connection_state", "ssl", "client", "server", "send",
    ]
    source = inspect.getsource(H11Protocol._handle_events)
    assert "except h11.RemoteProtocolError as error:" in source
    assert "await self._send_error_response(error.error_status_hint)" in source
    assert "await self._create_stream(event)" in source
    assert issubclass(_h11front.FrontH11Protocol, H11Protocol)
    # Its _handle_events is Hypercorn's loop re-implemented (fingerprinted above),
    # reached through handle(RawData) and stopping where h11 is lenient.
    assert _h11front.FrontH11Protocol._handle_events is not H11Protocol._handle_events
    assert "await self._handle_events()" in inspect.getsource(H11Protocol.handle)
    # What it reads of h11: the bytes not parsed yet, and the must-close state.
    assert hasattr(h11.Connection, "trailing_data") and h11.MUST_CLOSE is not None
    # The leniency the chunk-line check exists for (if h11 drops it, the check is moot).
    assert h11._readers.chunk_header_re.fullmatch(b"30 \r\n") is not None  # type: ignore[attr-defined]


def test_h11_protocol_exposes_its_h11_connection() -> None:
    # KeepAliveTCPServer._request_read reads ``protocol.connection.their_state``.
    source = inspect.getsource(H11Protocol.__init__)
    assert "self.connection" in source and "h11.Connection(" in source
    assert h11.DONE is not None and hasattr(h11.Connection, "their_state")


def test_task_group_hooks() -> None:
    group = task_group.TaskGroup()
    assert hasattr(group, "_nursery"), "TaskGroup no longer keeps _nursery"
    params = list(inspect.signature(task_group._handle).parameters)
    assert params == ["app", "config", "scope", "receive", "send", "sync_spawn", "call_soon"]
    params = list(inspect.signature(task_group.TaskGroup.spawn_app).parameters)
    assert params == ["self", "app", "config", "scope", "send"]
    assert issubclass(_appchannel.AppTaskGroup, task_group.TaskGroup)


def test_lean_stream_hooks() -> None:
    # The attributes LeanStream reads on its protocol, set by H11Protocol.__init__.
    source = inspect.getsource(H11Protocol.__init__)
    for name in (
        "app", "config", "context", "task_group", "connection", "connection_state",
        "client", "server", "ssl", "send", "stream", "keep_alive_requests",
    ):
        assert re.search(rf"self\.{name}\b[^=\n]*=", source), f"H11Protocol no longer sets {name}"
    assert issubclass(_leanstream.LeanH11Protocol, H11Protocol)
    assert callable(_appchannel.AppTaskGroup.spawn_app_direct)
    # The stream events it takes from _handle_events / _close_stream, by type.
    events = inspect.getsource(H11Protocol._handle_events)
    assert "self.stream.handle(Body(" in events and "self.stream.handle(EndBody(" in events
    assert "self._check_protocol(event)" in events and "self._create_stream(event)" in events
    assert "StreamClosed(" in inspect.getsource(H11Protocol._close_stream)
    # The states it shares with HTTPStream.
    assert {s.name for s in http_stream.ASGIHTTPState} == {"REQUEST", "RESPONSE", "TRAILERS", "CLOSED"}


def test_the_lean_stream_uses_the_h11_hypercorn_uses() -> None:
    assert _leanstream.h11 is h11_protocol.h11 is _tcpserver.h11 is _h11.front_h11()
    headers = h11.Request(method="GET", target="/", headers=[("Host", "t")]).headers
    assert all(len(item) == 3 for item in headers._full_items)  # type: ignore[attr-defined]
