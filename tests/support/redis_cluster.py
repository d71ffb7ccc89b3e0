"""A small Redis Cluster on loopback for tests: three masters, no replicas, no persistence.

:class:`RedisClusterProcess` starts three ``redis-server --cluster-enabled yes`` processes on free
loopback ports, assigns the 16384 hash slots in three ranges (``CLUSTER ADDSLOTS``, what
``redis-cli --cluster create`` does), joins the nodes (``CLUSTER MEET``) and waits, polling with
a deadline, until every node reports ``cluster_state:ok`` and knows the whole slot map.
:meth:`RedisClusterProcess.close` terminates every process it started. A node can be stopped and
started again (same port, same cluster configuration file, empty data set). Synchronous
redis-py: it runs in session fixtures.
"""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.processes import stop_popen
from tests.support.redis_server import redis_server_command

#: Hash slots of a Redis Cluster.
SLOTS = 16384
#: Masters of the test cluster.
NODES = 3
#: Forming the cluster takes about two seconds (a master waits 2 s after its start before it
#: declares the cluster state ok); this bounds a broken start.
CLUSTER_START_DEADLINE_S = 20.0
CLUSTER_STOP_DEADLINE_S = 10.0
POLL_S = 0.01
#: A node's cluster bus listens on its port plus this.
BUS_PORT_OFFSET = 10000


class ClusterStartError(RuntimeError):
    """The servers could not be started or did not form a cluster (no cluster support?)."""


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_node_port(taken: set[int]) -> int:
    """A free loopback port whose cluster bus port (port + 10000) is free too, not in *taken*."""
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(20000, 65535 - BUS_PORT_OFFSET)
        bus = port + BUS_PORT_OFFSET
        if not {port, bus} & taken and _port_free(port) and _port_free(bus):
            return port
    raise ClusterStartError("no free pair of loopback ports for a cluster node")


def _client(port: int) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        socket_connect_timeout=0.5,
        socket_timeout=2.0,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


def _until(deadline: float, condition: Callable[[], bool], what: str) -> None:
    """Poll *condition()* until true (a condition with a deadline, not a blind sleep)."""
    while not condition():
        if time.monotonic() > deadline:
            raise ClusterStartError(f"timed out waiting for {what}")
        time.sleep(POLL_S)


class RedisClusterProcess:
    """Three ``redis-server`` masters on loopback ports forming one Redis Cluster.

    Args:
        executable: the ``redis-server`` to run.
        nodes: how many masters.
        node_timeout_ms: ``cluster-node-timeout``: how soon the others see a stopped node fail.

    Attributes:
        ports: the nodes' client ports, in the order of their slot ranges.
    """

    def __init__(self, executable: str, *, nodes: int = NODES, node_timeout_ms: int = 5000) -> None:
        self.executable = executable
        self.node_timeout_ms = node_timeout_ms
        taken: set[int] = set()
        self.ports: list[int] = []
        for _ in range(nodes):
            port = _free_node_port(taken)
            taken |= {port, port + BUS_PORT_OFFSET}
            self.ports.append(port)
        self._processes: dict[int, subprocess.Popen[bytes]] = {}
        self._tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        """URL of the first node (a startup node of the cluster)."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def client(self, index: int) -> redis.Redis:
        """A plain synchronous client of node *index* (decoded replies); close it after use."""
        return _client(self.ports[index])

    def node_of_slot(self, slot: int) -> int:
        """The index of the node serving hash slot *slot* (asked of the first running node)."""
        index = min(self._processes)
        client = self.client(index)
        try:
            for first, last, master, *_ in client.execute_command("CLUSTER", "SLOTS"):
                if int(first) <= slot <= int(last):
                    return self.ports.index(int(master[1]))
        finally:
            client.close()
        raise LookupError(f"slot {slot} is not served")

    # Lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the servers and form the cluster, within :data:`CLUSTER_START_DEADLINE_S`.

        Raises:
            ClusterStartError: a server exited, or the cluster did not form in time.
        """
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="redis-cluster-test-")
        deadline = time.monotonic() + CLUSTER_START_DEADLINE_S
        for index in range(len(self.ports)):
            self._spawn(index)
        clients = [_client(port) for port in self.ports]
        try:
            for index, client in enumerate(clients):
                _until(deadline, lambda c=client: self._answers(c), f"node {index} up")
                if not client.info("cluster").get("cluster_enabled"):
                    raise ClusterStartError("this redis-server has no cluster support")
            # Distinct config epochs, as redis-cli --cluster create sets them.
            per_node = SLOTS // len(clients)
            for index, client in enumerate(clients):
                client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", index + 1)
                first = index * per_node
                last = SLOTS - 1 if index == len(clients) - 1 else first + per_node - 1
                client.execute_command("CLUSTER", "ADDSLOTS", *range(first, last + 1))
            # Every node meets every other one: the full mesh forms without waiting for gossip.
            for client, own in zip(clients, self.ports, strict=True):
                for port in self.ports:
                    if port != own:
                        client.execute_command("CLUSTER", "MEET", "127.0.0.1", port)
        finally:
            for client in clients:
                client.close()
        self.wait_formed(deadline)

    def _spawn(self, index: int) -> None:
        assert self._tmp is not None
        self._processes[index] = subprocess.Popen(
            redis_server_command(
                self.executable,
                self.ports[index],
                self._tmp.name,
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                f"{self._tmp.name}/nodes-{index}.conf",
                "--cluster-node-timeout",
                str(self.node_timeout_ms),
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _answers(self, client: redis.Redis) -> bool:
        for process in self._processes.values():
            if process.poll() is not None:
                raise ClusterStartError(
                    f"redis-server exited with {process.returncode} (no cluster support?)"
                )
        try:
            client.ping()
        except redis.ConnectionError:
            return False
        return True

    def formed(self, index: int) -> bool:
        """Whether node *index* says ``cluster_state:ok``, knows every node and every slot."""
        client = self.client(index)
        try:
            info = dict(
                line.split(":", 1)
                for line in client.execute_command("CLUSTER", "INFO").splitlines()
                if ":" in line
            )
            if info.get("cluster_state") != "ok":
                return False
            if info.get("cluster_known_nodes") != str(len(self.ports)):
                return False
            # The gossip reached it: it knows who serves each range.
            ranges = client.execute_command("CLUSTER", "SLOTS")
        except redis.ConnectionError:
            return False
        finally:
            client.close()
        covered = sum(int(r[1]) - int(r[0]) + 1 for r in ranges)
        return covered == SLOTS and {int(r[2][1]) for r in ranges} == set(self.ports)

    def wait_formed(self, deadline: float | None = None) -> None:
        """Return once every node is :meth:`formed` (ClusterStartError after the deadline)."""
        if deadline is None:
            deadline = time.monotonic() + CLUSTER_START_DEADLINE_S
        for index in range(len(self.ports)):
            _until(deadline, lambda i=index: self.formed(i), f"node {index} in the cluster")

    def stop_node(self, index: int) -> None:
        """Terminate node *index* (its cluster configuration file stays)."""
        stop_popen(self._processes.pop(index), CLUSTER_STOP_DEADLINE_S)

    def start_node(self, index: int) -> None:
        """Start node *index* again (empty data set) and wait until the cluster is whole."""
        self._spawn(index)
        self.wait_formed()

    def flush(self) -> None:
        """Empty every node (``FLUSHALL``)."""
        for index in range(len(self.ports)):
            client = self.client(index)
            try:
                client.flushall()
            finally:
                client.close()

    def close(self) -> None:
        """Terminate every server (kill it if it does not exit in time) and remove its files."""
        processes, self._processes = list(self._processes.values()), {}
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
        for process in processes:
            try:
                process.wait(CLUSTER_STOP_DEADLINE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(CLUSTER_STOP_DEADLINE_S)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
