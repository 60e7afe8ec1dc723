"""Starts Horovod ranks inside a VirtualCluster's namespaces, without ssh.

What ``horovodrun --gloo`` does for one host, done per namespace: Horovod's
own rendezvous HTTP server, bound to the bridge address so that rendezvous
traffic stays inside the virtual network, is told the slot plan (one slot per
namespace, so every rank is its own "host": local size 1, cross size W), and
each rank gets the Gloo environment ``horovod.runner.gloo_run`` would give it:
HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HOROVOD_CONTROLLER/CPU_OPERATIONS=gloo,
HOROVOD_GLOO_IFACE, HOROVOD_HOSTNAME and HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*.
"""

import os
import signal
import subprocess
import sys
import threading
import time

from tf_mergecomp import _keras

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class RankFailure(RuntimeError):
    pass


class RendezvousServer:
    """Horovod's rendezvous HTTP server on a chosen address; a context manager."""

    def __init__(self, address):
        self.address = address
        self.port = None
        self._server = None
        self._thread = None

    def start(self, hostnames):
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        self._server = RendezvousHTTPServer((self.address, 0), RendezvousHandler, 0)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        size = len(hostnames)
        plan = [
            SlotInfo(hostname=host, rank=rank, local_rank=0, cross_rank=rank,
                     size=size, local_size=1, cross_size=size)
            for rank, host in enumerate(hostnames)
        ]
        self._server.init(plan)
        return self

    def stop(self):
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=10)
            self._server = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def rank_environment(rank, size, hostname, iface, server_address, port, threads=1, extra_env=None):
    env = _keras.child_environ(**(extra_env or {}))
    env.update({
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": server_address,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "120",
        "HOROVOD_HOSTNAME": hostname,
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": str(rank),
        "HOROVOD_CROSS_SIZE": str(size),
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (_REPO_ROOT, os.environ.get("PYTHONPATH")) if p),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "OMP_NUM_THREADS": str(threads),
        "MERGECOMP_BENCH_TF_THREADS": str(threads),
    })
    return env


def _kill(process):
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def run_ranks(cluster, argv, log_dir, timeout_s, log_prefix="rank", extra_env=None):
    """Runs ``python argv...`` once per namespace of ``cluster``; all ranks must exit 0.

    ``extra_env`` is added to every rank's environment.

    Output of rank r goes to ``log_dir/<log_prefix><r>.log``. Raises RankFailure
    (after killing the other ranks) when one fails or the timeout passes.
    """
    os.makedirs(log_dir, exist_ok=True)
    size = len(cluster.namespaces)
    processes, logs = [], []
    with RendezvousServer(cluster.server_address) as server:
        server.start(cluster.namespaces)
        try:
            for rank in range(size):
                env = rank_environment(rank, size, cluster.namespaces[rank], cluster.iface,
                                       cluster.server_address, server.port, extra_env=extra_env)
                log_path = os.path.join(log_dir, "%s%d.log" % (log_prefix, rank))
                log = open(log_path, "w")
                logs.append(log_path)
                processes.append(subprocess.Popen(
                    cluster.exec_prefix(rank) + [sys.executable] + list(argv),
                    env=env, stdout=log, stderr=subprocess.STDOUT, cwd=_REPO_ROOT,
                    start_new_session=True,
                ))
                log.close()
            deadline = time.monotonic() + timeout_s
            while True:
                codes = [p.poll() for p in processes]
                failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
                if failed:
                    raise RankFailure("rank %d exited with %d; see %s"
                                      % (failed[0], codes[failed[0]], logs[failed[0]]))
                if all(c == 0 for c in codes):
                    return logs
                if time.monotonic() > deadline:
                    raise RankFailure("ranks still running after %.0f s; see %s" % (timeout_s, log_dir))
                time.sleep(0.5)
        finally:
            for process in processes:
                _kill(process)


def tail(path, lines=15):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""
