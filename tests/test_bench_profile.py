"""bench/profile_gateway.py assigns each py-spy sample to the layer the docs name,
by file and function names of this tree: when a refactor renames what it
matches on, these fail instead of the page quietly showing wrong layers."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from bench import profile_gateway  # noqa: E402
from trioforward.http import _pool  # noqa: E402
from trioforward.server.front import _asgi  # noqa: E402
from trioforward.server.front._worker import KeepAliveTCPServer  # noqa: E402
from trioforward.server.proxy import _forward  # noqa: E402

PKG = ROOT / "trioforward"
# Where the classes the profile matches on live now (a move must keep the layers right).
TCP_SERVER = inspect.getsourcefile(KeepAliveTCPServer)
RESPOND = inspect.getsourcefile(_asgi.respond)
SITE = "/venv/lib/python3.11/site-packages"
RUN = f"unrolled_run ({SITE}/trio/_core/_run.py:2866)"
TASK = f"_run_handler ({SITE}/trio/_highlevel_serve_listeners.py:28)"


def _line(path: Path, needle: str) -> int:
    """The first line of ``path`` containing ``needle`` (1-based)."""
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if needle in text:
            return number
    raise AssertionError(f"{needle!r} not in {path}")


def frame(function: str, path: Path | str, line: int = 1) -> str:
    return f"{function} ({path}:{line})"


def test_the_functions_the_profile_matches_on_exist() -> None:
    assert inspect.iscoroutinefunction(_asgi.respond)
    assert inspect.iscoroutinefunction(_forward._relay_stream)
    assert hasattr(KeepAliveTCPServer, "_receive") and hasattr(KeepAliveTCPServer, "_write")
    pool = Path(_pool.__file__).read_text()
    assert "_write(" in pool and "_read(" in pool


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        # the run loop with no task running
        ([f"run ({SITE}/trio/_core/_run.py:2535)", f"EpollIOManager.get_events ({SITE}/trio/_core/_io_epoll.py:243)"],
         ("scheduler", "")),
        ([RUN], ("scheduler", "")),
        # the pool's write system call: charged to the line that made it
        ([RUN, frame("ConnectionPool.request", PKG / "http/_pool.py", _line(PKG / "http/_pool.py", "_write(fd"))],
         ("pool", "socket I/O (system calls)")),
        ([RUN, frame("ConnectionPool.request", PKG / "http/_pool.py", 70),
          frame("Connection.next_event", f"{SITE}/h11/_connection.py", 470)],
         ("pool", "h11 client")),
        ([RUN, frame("Dispatcher._dispatch", PKG / "dispatch/attempts/_dispatch.py", 100),
          frame("CapacityLimiter.acquire", f"{SITE}/trio/_sync.py", 300)],
         ("dispatch", "")),
        # the server side: parsing a request vs writing a response under the app's send
        ([RUN, TASK, frame("KeepAliveTCPServer._read_data", TCP_SERVER, 260),
          frame("H11Protocol.handle", f"{SITE}/hypercorn/protocol/h11.py", 120),
          frame("Connection.next_event", f"{SITE}/h11/_connection.py", 470)],
         ("front server", "HTTP parse (h11)")),
        # the front's read system call: charged to the line that made it
        ([RUN, TASK, frame("KeepAliveTCPServer._receive", TCP_SERVER,
                           _line(Path(str(TCP_SERVER)), "os.read("))],
         ("front server", "read (system call)")),
        ([RUN, frame("Front.__call__", RESPOND, 100),
          frame("respond", RESPOND, 210),
          frame("HTTPStream.app_send", f"{SITE}/hypercorn/protocol/http_stream.py", 180),
          frame("Connection.send", f"{SITE}/h11/_connection.py", 500)],
         ("response write", "h11 serialize")),
        ([RUN, frame("Front.__call__", PKG / "server/front/_asgi.py", 100),
          frame("parse_body", PKG / "server/base/_validate.py", 40)],
         ("validation/JSON", "")),
        ([RUN, frame("Instruments.call", f"{SITE}/trio/_core/_instrumentation.py", 107)], ("probes", "")),
    ],
)
def test_samples_go_to_their_layer(stack: list[str], expected: tuple[str, str]) -> None:
    assert profile_gateway.classify(stack) == expected


def test_layers_sums_raw_samples(tmp_path: Path) -> None:
    raw = tmp_path / "samples.txt"
    write = frame("ConnectionPool.request", PKG / "http/_pool.py", _line(PKG / "http/_pool.py", "_write(fd"))
    raw.write_text(
        f"process 1:\"python\";thread (0x1);{RUN};{write} 3\n"
        f"process 1:\"python\";thread (0x1);{RUN} 1\n"
    )
    counts, parts, total = profile_gateway._layers(raw)
    assert total == 4
    assert counts == {"pool": 3, "scheduler": 1}
    assert parts == {"pool: socket I/O (system calls)": 3}
