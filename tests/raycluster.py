"""A real multi-node Ray cluster on this machine for tests: `ray start` processes, one temp dir per node.

Each node is its own `ray start` (its own raylet, node id, object store and
--temp-dir); worker nodes get their own loopback IP (127.0.0.2, ...) and the
custom resources a test forces cells onto. The cluster uses token
authentication with a token of its own (RAY_AUTH_TOKEN), so it neither reads
~/.ray nor accepts another cluster's clients; every process it starts inherits
that token, a TIMBENCH_TEST_NODE name and the node's own TMPDIR in its environment, which is how
`kill_node` finds all of one node's processes (raylet, agents, workers) and
`stop` all of the cluster's, by pid. `ray stop` is never used: it would stop
every Ray on the machine.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE = 80 * 1024 * 1024  # bytes per node: the snapshots are a few hundred kB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    def __init__(self):
        # Short: Ray's unix sockets live under each node's temp dir and AF_UNIX paths stop at 107 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="tbray-", dir="/tmp"))
        self.token = secrets.token_hex(32)
        self.port = free_port()
        self.address = None
        self.env = {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_USAGE_STATS_ENABLED": "0",
            "OMP_NUM_THREADS": "1",
            "NUMBA_NUM_THREADS": "1",
        }
        self.nodes: list[str] = []
        self.start_s: dict[str, float] = {}

    def _start(self, name: str, args: list[str]) -> None:
        t0 = time.monotonic()
        temp = self.root / name
        cmd = [
            RAY,
            "start",
            "--temp-dir",
            str(temp),
            "--object-store-memory",
            str(OBJECT_STORE),
            "--disable-usage-stats",
            "--metrics-export-port",
            str(free_port()),
            "--dashboard-agent-listen-port",
            str(free_port()),
            *args,
        ]
        # TMPDIR: the node's own scratch space (workers inherit it; the Ray backend's scratch goes there).
        self.scratch(name).mkdir(parents=True)
        r = subprocess.run(
            cmd,
            env={**self.env, "TIMBENCH_TEST_NODE": name, "TMPDIR": str(self.scratch(name))},
            capture_output=True,
            text=True,
            timeout=120,
        )
        if r.returncode != 0:
            raise RuntimeError(f"ray start ({name}) failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
        self.nodes.append(name)
        self.start_s[name] = time.monotonic() - t0

    def scratch(self, node: str) -> Path:
        return self.root / f"{node}-tmp"

    def start_head(self, num_cpus: int = 1) -> str:
        self._start(
            "head",
            [
                "--head",
                "--port",
                str(self.port),
                "--num-cpus",
                str(num_cpus),
                "--include-dashboard=false",
                "--dashboard-port",
                str(free_port()),
            ],
        )
        self.address = f"127.0.0.1:{self.port}"
        return self.address

    def add_node(self, name: str, ip: str, resources: dict, num_cpus: int = 1) -> None:
        self._start(
            name,
            [
                "--address",
                self.address,
                "--node-ip-address",
                ip,
                "--num-cpus",
                str(num_cpus),
                "--resources",
                json.dumps(resources),
            ],
        )

    def pids(self, node: str | None = None) -> list[int]:
        """Processes of this cluster (of one node when `node` is given), found by their environment."""
        mine = f"RAY_AUTH_TOKEN={self.token}".encode()
        want = f"TIMBENCH_TEST_NODE={node}".encode() if node else None
        out = []
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                env = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if mine in env and (want is None or want in env):
                out.append(int(d.name))
        return out

    def kill_node(self, node: str) -> int:
        """SIGKILL every process of `node` (a machine dying); returns how many."""
        pids = self.pids(node)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def stop(self) -> None:
        for _ in range(3):  # a raylet may fork a worker while we kill
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        shutil.rmtree(self.root, ignore_errors=True)
