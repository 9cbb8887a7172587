"""The testbed's latency relay: every task and hook connection between nodes passes it.

This kernel has no ``netem`` qdisc, so latency is added here, as toxiproxy's latency
toxic does: each chunk read from one side is held until ``delay`` after it arrived, then
written to the other side, in order, so a slow link still carries many chunks in flight
(bandwidth is shaped apart from this, by ``tbf`` on the nodes' links: ``bed.py``).

A chunk a node sends waits that node's latency, as ``netem delay`` on every node's
egress would add it: client -> server chunks wait the client node's latency, server ->
client chunks the server node's, so two nodes at 10 ms see a 20 ms round trip. The
delays are read from the config file again whenever it changes, so a link can turn slow
while a job runs.

Jitter: a node's ``jitter_ms`` adds to each chunk's delay a uniform draw in [-jitter,
+jitter] (at least 0), as ``netem delay L J`` does, but a chunk never overtakes the one
before it (a TCP stream has one order), so a large jitter also slows the stream down.

The relay listens on every node's advertised address (where the cluster spec points) on
the hook's port and every task port, and connects to the node's own address on the same
port: TF checks that a task's port in the spec is the port it serves on, the host may
differ. It connects *from* the sending node's advertised address, so a node sees each
peer at the address the cluster spec gives it, as on a real network, and its hook's
firewall (``tfsync.hooks.firewall``) can tell the cluster's hosts from others; a client
that is not a node is passed on from the bridge's address, which no firewall lets in.
``python -m tfsync.testbed.relay CONFIG`` (run by ``tfsync testbed up`` in the
testbed's wire namespace); the config:

    {"nodes": {"n1": {"address": "198.18.0.11", "advertised": "198.18.1.11", "latency_ms": 10,
                      "jitter_ms": 2}, ...},
     "ports": [[7070, 7070], [20000, 20099]]}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import resource
import sys

logger = logging.getLogger("tfsync.testbed.relay")

CHUNK = 64 * 1024
QUEUE_CHUNKS = 256          # at most 16 MiB held per direction of a connection
CONNECT_TIMEOUT_S = 10.0    # a firewall that drops the relay's connection: the client's ends then
RELOAD_S = 0.2


class Relay:
    def __init__(self, config_path: str):
        self.config_path = config_path
        self._mtime = 0.0
        self.nodes: dict = {}
        self.latency: dict[str, float] = {}   # node address -> seconds a chunk it sent is held
        self.load()

    def load(self) -> bool:
        """Read the config again if it changed; True if it did."""
        mtime = os.stat(self.config_path).st_mtime
        if mtime == self._mtime:
            return False
        with open(self.config_path) as f:
            config = json.load(f)
        self._mtime = mtime
        self.nodes = config["nodes"]
        self.ports = [tuple(r) for r in config["ports"]]
        self.latency = {n["address"]: n.get("latency_ms", 0.0) / 1000.0 for n in self.nodes.values()}
        self.jitter = {n["address"]: n.get("jitter_ms", 0.0) / 1000.0 for n in self.nodes.values()}
        self.advertised = {n["address"]: n["advertised"] for n in self.nodes.values()}
        return True

    async def watch(self) -> None:
        while True:
            await asyncio.sleep(RELOAD_S)
            try:
                if self.load():
                    logger.info("latency now %s", {k: v["latency_ms"] for k, v in self.nodes.items()})
            except (OSError, ValueError, KeyError) as e:
                logger.warning("config %s not read again (%s): the delays stay as they were", self.config_path, e)

    async def serve(self) -> None:
        servers = []
        for node in self.nodes.values():
            for first, last in self.ports:
                for port in range(first, last + 1):
                    servers.append(await asyncio.start_server(
                        self._handler(node["address"], port), node["advertised"], port, reuse_address=True))
        print(f"tfsync relay: {len(servers)} ports on {len(self.nodes)} nodes", flush=True)
        await self.watch()

    def _handler(self, target: str, port: int):
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            client = writer.get_extra_info("peername")[0]
            source = self.advertised.get(client)   # the sender as the spec names it; None: not a node
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(
                    target, port, local_addr=(source, 0) if source else None), CONNECT_TIMEOUT_S)
            except (OSError, asyncio.TimeoutError):
                writer.close()   # nothing listens there: the client sees the connection end
                return
            pipes = [asyncio.ensure_future(self._pipe(reader, up_writer, client)),
                     asyncio.ensure_future(self._pipe(up_reader, writer, target))]
            try:   # one side ending (EOF) half-closes the other; an error (a reset) ends both
                await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
            finally:
                for pipe in pipes:
                    pipe.cancel()
                writer.close()
                up_writer.close()
        return handle

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, sender: str) -> None:
        """Copy ``reader`` to ``writer``, each chunk held for the latency of ``sender``'s node."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue(QUEUE_CHUNKS)

        async def read():
            try:
                while data := await reader.read(CHUNK):
                    await queue.put((loop.time(), data))
            finally:
                await queue.put(None)

        async def write():
            release = 0.0   # when the last chunk went out: the next never goes before it
            while (item := await queue.get()) is not None:
                jitter = self.jitter.get(sender, 0.0)
                delay = max(0.0, self.latency.get(sender, 0.0) + (random.uniform(-jitter, jitter) if jitter else 0.0))
                release = max(release, item[0] + delay)
                wait = release - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(item[1])
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()

        reading = asyncio.ensure_future(read())
        try:
            await write()
        finally:
            reading.cancel()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tfsync.testbed.relay",
                                description="The testbed's latency relay (started by tfsync testbed up).")
    p.add_argument("config", help="the relay's JSON config (nodes, their latency, the ports to relay)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a listening socket per node and port
    try:
        asyncio.run(Relay(args.config).serve())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
