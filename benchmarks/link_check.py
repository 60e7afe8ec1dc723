"""What the virtual cluster's shaped links deliver: TCP around the ring, all at once.

A tc rate is a ceiling, not a promise. On a host of a few cores the kernel's
own work (TCP, the veth pairs, the token buckets) runs on the cores the ranks
use: on this project's 2-core host a link shaped to 10 Gbit/s moved 8.6
Gbit/s each way with nothing else running and 4.7 to 6.4 beside a compile,
one of 100 Gbit/s 8.5, one of 1 Gbit/s 0.90 to 0.94 (TCP's headers ride
inside the rate). A model that prices a collective at the nominal rate then
predicts its bytes up to twice as fast as they go. So the cluster benchmark
measures its links once, before the configs, the way a ring allreduce uses
them: every worker sends to the next (in its namespace, on its rank's cores)
while it receives from the one before, the same bytes each; the ring moves
at its slowest link's pace.

Run as a program (``python link_check.py peer ...``) inside a namespace it
imports nothing but the standard library, so it starts in milliseconds.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

PORT = 5599
CHUNK_BYTES = 1 << 20
# Each measurement moves about this many seconds of the nominal rate per link,
# within these bounds (a 100 Gbit/s link's second would be 12.5 GB).
SECONDS_AT_NOMINAL = 0.5
MIN_BYTES = 4 << 20
MAX_BYTES = 1 << 30
REPEATS = 3
# How much an unshaped ring (no tc rate) moves per link: 10 Gbit/s's 0.5 s.
NOMINAL_UNSHAPED_BYTES_PER_S = 10e9 / 8
CONNECT_TIMEOUT_S = 10.0


def transfer_bytes(nominal_bytes_per_s):
    return int(min(MAX_BYTES, max(MIN_BYTES, nominal_bytes_per_s * SECONDS_AT_NOMINAL)))


def peer(listen, send_to, nbytes, timeout_s):
    """Receives ``nbytes`` on ``listen`` while sending as many to ``send_to``;
    returns the received bytes and the seconds from the first to the last."""
    deadline = time.monotonic() + timeout_s
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((listen, PORT))
    server.listen(1)
    server.settimeout(timeout_s)
    received = {"bytes": 0, "seconds": None, "error": None}

    def receive():
        try:
            connection, _ = server.accept()
            connection.settimeout(max(0.1, deadline - time.monotonic()))
            buffer = bytearray(CHUNK_BYTES)
            view = memoryview(buffer)
            first = None
            while received["bytes"] < nbytes and time.monotonic() < deadline:
                count = connection.recv_into(view)
                if not count:
                    break
                if first is None:
                    first = time.perf_counter()
                received["bytes"] += count
            if first is not None:
                received["seconds"] = time.perf_counter() - first
            connection.close()
        except OSError as error:
            received["error"] = str(error)

    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    sender = _connect(send_to, deadline)
    chunk = memoryview(bytes(CHUNK_BYTES))
    sent = 0
    sender.settimeout(max(0.1, deadline - time.monotonic()))
    while sent < nbytes and time.monotonic() < deadline:
        size = min(CHUNK_BYTES, nbytes - sent)
        sender.sendall(chunk[:size])
        sent += size
    sender.close()
    receiver.join(max(0.0, deadline - time.monotonic()))
    server.close()
    if received["error"] is None and received["bytes"] < nbytes:
        received["error"] = "received %d of %d bytes within %.0f s" % (
            received["bytes"], nbytes, timeout_s)
    return received


def _connect(address, deadline):
    """The other worker may not listen yet: retry until it does or time runs out."""
    while True:
        try:
            return socket.create_connection(
                (address, PORT), timeout=max(0.1, min(CONNECT_TIMEOUT_S,
                                                      deadline - time.monotonic())))
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


class Loopback:
    """``workers`` ranks on this host's loopback, as the profile's probe runs
    them: the same interface as a virtual cluster for ``measure``."""

    def __init__(self, workers):
        self.namespaces = [None] * workers
        self.addresses = ["127.0.0.%d" % (rank + 1) for rank in range(workers)]

    def exec_prefix(self, rank):
        return []


def measure(cluster, nominal_bytes_per_s, cores_of=None, repeats=REPEATS, timeout_s=60.0):
    """Measures ``cluster``'s ring ``repeats`` times; ``cores_of(rank)`` gives the
    cores each worker's peer runs on (None: anywhere). Returns a dict: the
    nominal and delivered bytes per second (the median over repeats of the
    slowest link's rate), every link's rate per repeat, and the bytes moved."""
    workers = len(cluster.namespaces)
    if workers < 2:
        raise ValueError("a link check needs at least 2 workers, got %d" % workers)
    nbytes = transfer_bytes(nominal_bytes_per_s)
    rings = []
    for _ in range(repeats):
        processes = []
        for rank in range(workers):
            command = list(cluster.exec_prefix(rank))
            if cores_of is not None:
                command += ["taskset", "-c", ",".join(str(c) for c in cores_of(rank))]
            command += [sys.executable, os.path.abspath(__file__), "peer",
                        "--listen", cluster.addresses[rank],
                        "--send-to", cluster.addresses[(rank + 1) % workers],
                        "--bytes", str(nbytes), "--timeout", str(timeout_s)]
            processes.append(subprocess.Popen(command, stdout=subprocess.PIPE,
                                              stderr=subprocess.PIPE, text=True))
        results = []
        for process in processes:
            try:
                out, err = process.communicate(timeout=timeout_s + 10.0)
            except subprocess.TimeoutExpired:
                process.kill()
                out, err = process.communicate()
            try:
                results.append(json.loads(out.strip().splitlines()[-1]))
            except (IndexError, json.JSONDecodeError):
                raise RuntimeError("link check peer failed (exit %s): %s"
                                   % (process.returncode, err.strip()[-500:])) from None
        failed = [r["error"] for r in results if r["error"]]
        if failed:
            raise RuntimeError("link check: %s" % "; ".join(failed))
        rings.append([r["bytes"] / r["seconds"] for r in results])
    return {"nominal_bytes_per_s": float(nominal_bytes_per_s),
            "delivered_bytes_per_s": float(statistics.median(min(ring) for ring in rings)),
            "links_bytes_per_s": rings, "bytes_per_link": nbytes, "workers": workers}


def measure_on_rank_cores(cluster, nominal_bytes_per_s, pin_cores):
    """``measure``, each worker's side on its rank's share of this process's
    cores when the ranks keep to theirs (``worker.own_cores``); a check that
    fails gives ``{"error": ...}`` instead, for the caller to report and go on."""
    from benchmarks import worker

    workers = len(cluster.namespaces)
    cores = sorted(os.sched_getaffinity(0))
    try:
        return measure(cluster, nominal_bytes_per_s,
                       cores_of=(lambda rank: worker.own_cores(rank, workers, cores))
                       if pin_cores else None)
    except (RuntimeError, OSError) as error:
        return {"error": str(error)}


def describe(check):
    if check.get("error"):
        return "Links: not measured (%s); collectives priced at the nominal rate" % check["error"]
    nominal = check["nominal_bytes_per_s"]
    return ("Links: %.2f Gbit/s delivered of %s, each way, every worker sending to the next "
            "at once (slowest link, median of %d)" % (
                check["delivered_bytes_per_s"] * 8e-9,
                "unshaped links" if nominal is None else "%.2f nominal" % (nominal * 8e-9),
                len(check["links_bytes_per_s"])))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run_peer = sub.add_parser("peer", help="one worker's side (runs inside its namespace)")
    run_peer.add_argument("--listen", required=True)
    run_peer.add_argument("--send-to", required=True)
    run_peer.add_argument("--bytes", type=int, required=True)
    run_peer.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(peer(args.listen, args.send_to, args.bytes, args.timeout)), flush=True)


if __name__ == "__main__":
    main()
