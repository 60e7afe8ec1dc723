"""Starts Horovod ranks inside a VirtualCluster's namespaces: directly, or with horovodrun over ssh.

Every namespace is a machine of ``ranks_per_machine`` (N) ranks: ranks
m*N .. m*N+N-1 run in namespace m, so Horovod reports local size N and cross
size M (the namespaces) as on a cluster of M machines with N slots each. Ranks
of one namespace reach each other at its own address (the kernel routes a
namespace's own addresses over its loopback), ranks of different namespaces
over the shaped links.

``direct`` (the default): what ``horovodrun --gloo`` does for one host, done per namespace: Horovod's
own rendezvous HTTP server, bound to the bridge address so that rendezvous
traffic stays inside the virtual network, is told the slot plan (N slots per
namespace: local size N, cross size M), and
each rank gets the Gloo environment ``horovod.runner.gloo_run`` would give it:
HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, HOROVOD_CONTROLLER/CPU_OPERATIONS=gloo,
HOROVOD_GLOO_IFACE, HOROVOD_HOSTNAME and HOROVOD_RANK/SIZE/LOCAL_*/CROSS_*.

``horovodrun``: the real multi-host path. An ssh server runs in every
namespace (``sshd.SshServers``), and the unmodified ``horovodrun -np M*N -H
<ns0>:N,<ns1>:N,... --gloo`` starts the ranks as on a cluster: it checks ssh
to every host, starts its task services on them over ssh to find the
interface they share, starts the rendezvous server and launches each rank
with ``ssh <host> 'cd <cwd>; env ... python ...'``. The hosts share this
machine's filesystem, so the venv's python and the project are at the same
paths, as on a cluster with a shared home. Its output (each line prefixed
with ``[rank]<stdout>:``) goes to one log.

    python -m benchmarks.launcher [--launcher horovodrun] [--workers 2]
        [--ranks-per-machine 1] [--bandwidth 1gbit] [--timeout 900] SCRIPT [ARGS...]

runs ``python SCRIPT ARGS`` that way on a fresh virtual cluster (root), prints
the launch command and the job's output, and removes everything it made.
"""

import argparse
import contextlib
import functools
import glob
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks import netns, sshd

_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCHERS = ("direct", "horovodrun")
# horovodrun's time for ssh checks, task services and the interface probe
# (its default, 30 s, is short for a contended 2-core machine).
HOROVODRUN_START_TIMEOUT_S = 120


class RankFailure(RuntimeError):
    pass


def check_ranks_per_machine(ranks_per_machine):
    """The ranks each namespace (machine) runs: an integer >= 1."""
    if isinstance(ranks_per_machine, bool) or not isinstance(ranks_per_machine, int) \
            or ranks_per_machine < 1:
        raise ValueError("ranks per machine must be an integer >= 1 (the ranks each namespace "
                         "runs, as horovodrun -H host:N), got %r" % (ranks_per_machine,))
    return ranks_per_machine


def rank_placement(rank, size, ranks_per_machine=1):
    """Where rank ``rank`` of ``size`` sits when every machine holds ``ranks_per_machine``
    consecutive ranks, as horovodrun places them: its machine (``cross_rank``), its rank on
    the machine (``local_rank``), and the local and cross sizes."""
    check_ranks_per_machine(ranks_per_machine)
    if size % ranks_per_machine:
        raise ValueError("%d ranks do not fill machines of %d ranks each" % (size, ranks_per_machine))
    return {"local_rank": rank % ranks_per_machine, "local_size": ranks_per_machine,
            "cross_rank": rank // ranks_per_machine, "cross_size": size // ranks_per_machine}


class RendezvousServer:
    """Horovod's rendezvous HTTP server on a chosen address; a context manager."""

    def __init__(self, address):
        self.address = address
        self.port = None
        self._server = None
        self._thread = None

    def start(self, hostnames, ranks_per_machine=1):
        """Serves the slot plan of ``ranks_per_machine`` ranks on each of ``hostnames``."""
        from horovod.runner.common.util.hosts import SlotInfo
        from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

        self._server = RendezvousHTTPServer((self.address, 0), RendezvousHandler, 0)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        size = len(hostnames) * check_ranks_per_machine(ranks_per_machine)
        plan = [
            SlotInfo(hostname=hostnames[rank // ranks_per_machine], rank=rank, size=size,
                     **rank_placement(rank, size, ranks_per_machine))
            for rank in range(size)
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


def job_environment(threads=1, extra_env=None):
    """What every rank gets whichever the launcher: ``extra_env``, the project on
    PYTHONPATH, unbuffered output, ``threads`` threads per rank."""
    from tf_mergecomp import keras2  # imports TensorFlow: not for --help

    env = keras2.child_environ(**(extra_env or {}))
    env.update({
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "120",
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (_REPO_ROOT, os.environ.get("PYTHONPATH")) if p),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "OMP_NUM_THREADS": str(threads),
        "MERGECOMP_BENCH_TF_THREADS": str(threads),
    })
    return env


def rank_environment(rank, size, hostname, iface, server_address, port, threads=1, extra_env=None,
                     ranks_per_machine=1):
    """Horovod's Gloo environment of rank ``rank`` of ``size``, on the machine ``hostname``
    of ``ranks_per_machine`` consecutive ranks (``rank_placement``)."""
    placement = rank_placement(rank, size, ranks_per_machine)
    env = job_environment(threads, extra_env)
    env.update({
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": server_address,
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": iface,
        "HOROVOD_HOSTNAME": hostname,
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(placement["local_rank"]),
        "HOROVOD_LOCAL_SIZE": str(placement["local_size"]),
        "HOROVOD_CROSS_RANK": str(placement["cross_rank"]),
        "HOROVOD_CROSS_SIZE": str(placement["cross_size"]),
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


def run_ranks(cluster, argv, log_dir, timeout_s, log_prefix="rank", extra_env=None,
              ranks_per_machine=1):
    """Runs ``python argv...`` ``ranks_per_machine`` times in every namespace of ``cluster``
    (ranks m*N .. m*N+N-1 in namespace m); all ranks must exit 0.

    ``extra_env`` is added to every rank's environment.

    Output of rank r goes to ``log_dir/<log_prefix><r>.log``. Raises RankFailure
    (after killing the other ranks) when one fails or the timeout passes.
    """
    os.makedirs(log_dir, exist_ok=True)
    size = len(cluster.namespaces) * check_ranks_per_machine(ranks_per_machine)
    processes, logs = [], []
    with RendezvousServer(cluster.server_address) as server:
        server.start(cluster.namespaces, ranks_per_machine)
        try:
            for rank in range(size):
                machine = rank // ranks_per_machine
                env = rank_environment(rank, size, cluster.namespaces[machine], cluster.iface,
                                       cluster.server_address, server.port, extra_env=extra_env,
                                       ranks_per_machine=ranks_per_machine)
                log_path = os.path.join(log_dir, "%s%d.log" % (log_prefix, rank))
                log = open(log_path, "w")
                logs.append(log_path)
                processes.append(subprocess.Popen(
                    cluster.exec_prefix(machine) + [sys.executable] + list(argv),
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


def horovodrun_path():
    candidate = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return candidate if os.path.exists(candidate) else "horovodrun"


def run_local_horovodrun(module, spec, out_dir, num_proc, timeout_s, hosts=None):
    """Writes ``spec`` to OUT_DIR/spec.json and runs ``horovodrun -np N [-H HOSTS] --gloo
    python -m MODULE --worker OUT_DIR/spec.json`` on this machine (loopback), its
    output into OUT_DIR/horovodrun.log. Returns (the job's exit code, or None when
    it ran past ``timeout_s`` and was killed with all its processes; the log's path)."""
    import json

    os.makedirs(out_dir, exist_ok=True)
    spec_path = os.path.abspath(os.path.join(out_dir, "spec.json"))
    with open(spec_path, "w") as f:
        json.dump(spec, f, indent=1)
    log_path = os.path.join(out_dir, "horovodrun.log")
    repo_root = _REPO_ROOT
    command = ([horovodrun_path(), "-np", str(num_proc)] + (["-H", hosts] if hosts else [])
               + ["--gloo", sys.executable, "-m", module, "--worker", spec_path])
    from tf_mergecomp import keras2

    env = keras2.child_environ(
        TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(p for p in (repo_root, os.environ.get("PYTHONPATH")) if p))
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                   cwd=repo_root, start_new_session=True)
        try:
            return process.wait(timeout=timeout_s), log_path
        except subprocess.TimeoutExpired:
            return None, log_path
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


def horovodrun_command(servers, argv, ranks_per_machine=1):
    """``horovodrun -np M*N -H host0:N,...`` (N ranks on each of the M hosts) over
    ``servers``' ssh (port and key), running ``python argv``."""
    check_ranks_per_machine(ranks_per_machine)
    hosts = ",".join("%s:%d" % (host, ranks_per_machine) for host in servers.hosts)
    return [horovodrun_path(), "-np", str(len(servers.hosts) * ranks_per_machine), "-H", hosts,
            "--gloo",
            "--ssh-port", str(servers.port), "--ssh-identity-file", servers.identity_file,
            # Horovod's cache (~/.horovod) would keep this run's ssh and interface checks.
            "--disable-cache", "--start-timeout", str(HOROVODRUN_START_TIMEOUT_S),
            sys.executable] + list(argv)


def run_ranks_horovodrun(servers, argv, log_dir, timeout_s, log_prefix="rank", extra_env=None,
                         ranks_per_machine=1):
    """Runs ``python argv...`` ``ranks_per_machine`` times on every namespace of
    ``servers.cluster`` with horovodrun over ssh.

    Same contract as ``run_ranks``; the output of all ranks goes to
    ``log_dir/<log_prefix>s_horovodrun.log``, which starts with the command.
    Raises RankFailure when horovodrun exits non-zero or the timeout passes
    (then it and every rank it started are ended).
    """
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, "%ss_horovodrun.log" % log_prefix)
    command = horovodrun_command(servers, argv, ranks_per_machine)
    with open(log_path, "w") as log:
        log.write("$ %s\n" % shlex.join(command))
        log.flush()
        process = subprocess.Popen(servers.client_command(command), env=job_environment(extra_env=extra_env),
                                   stdout=log, stderr=subprocess.STDOUT, cwd=_REPO_ROOT,
                                   start_new_session=True)
    try:
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise RankFailure("horovodrun still running after %.0f s; see %s" % (timeout_s, log_path))
        if code != 0:
            raise RankFailure("horovodrun exited with %d; see %s" % (code, log_path))
        return [log_path]
    finally:
        _kill(process)
        servers.end_sessions()


@contextlib.contextmanager
def open_launcher(name, cluster, ranks_per_machine=1):
    """Yields ``run(argv, log_dir, timeout_s, log_prefix="rank", extra_env=None)`` that
    starts ``ranks_per_machine`` ranks in every namespace of the created ``cluster`` with
    launcher ``name``."""
    if name not in LAUNCHERS:
        raise ValueError("launcher must be one of %s, got %r" % (", ".join(LAUNCHERS), name))
    check_ranks_per_machine(ranks_per_machine)
    if name == "direct":
        yield functools.partial(run_ranks, cluster, ranks_per_machine=ranks_per_machine)
        return
    with sshd.SshServers(cluster) as servers:
        yield functools.partial(run_ranks_horovodrun, servers, ranks_per_machine=ranks_per_machine)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.launcher",
                                     description="Runs a training script on a virtual cluster "
                                                 "of network namespaces (root).")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="horovodrun")
    parser.add_argument("--workers", type=int, default=2, help="namespaces (machines)")
    parser.add_argument("--ranks-per-machine", type=int, default=1,
                        help="ranks in every namespace (horovodrun -H ns0:N,ns1:N; default 1)")
    parser.add_argument("--bandwidth", default="1gbit", help="tc rate per link, or 'none'")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole job")
    parser.add_argument("script", help="the training script (e.g. examples/train_digits.py)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments")
    args = parser.parse_args(argv)
    try:
        check_ranks_per_machine(args.ranks_per_machine)
        cluster = netns.VirtualCluster(args.workers, bandwidth=args.bandwidth, tag="l")
    except ValueError as error:
        parser.error(str(error))
    ok, reason = (sshd.available() if args.launcher == "horovodrun" else netns.available())
    if not ok:
        print("error: the %s launcher cannot run here: %s" % (args.launcher, reason), file=sys.stderr)
        return 2
    netns.cleanup_stale()
    log_dir = tempfile.mkdtemp(prefix="%s-logs-" % cluster.prefix)
    code = 0
    try:
        with netns.terminate_cleanly(), cluster, \
                open_launcher(args.launcher, cluster, args.ranks_per_machine) as run:
            print("[launcher] %d namespaces %s at %s, links %s, %d ranks per machine" % (
                args.workers, ", ".join(cluster.namespaces), ", ".join(cluster.addresses),
                args.bandwidth, args.ranks_per_machine), flush=True)
            try:
                logs = run([args.script] + args.args, log_dir, args.timeout, log_prefix="job")
            except RankFailure as failure:
                print("[launcher] failed: %s" % failure, flush=True)
                logs, code = sorted(os.path.join(log_dir, n) for n in os.listdir(log_dir)), 1
            for path in logs:
                with open(path) as f:
                    sys.stdout.write(f.read())
            sys.stdout.flush()
    except (KeyboardInterrupt, netns.Terminated) as interrupt:
        print("[launcher] interrupted (%s); ending the job" % (interrupt or "Ctrl-C"), flush=True)
        code = 130
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
        left = leftovers(cluster)
        print("[launcher] removed the cluster %s (namespaces, links, shaping%s)%s" % (
            cluster.prefix, ", ssh servers and keys" if args.launcher == "horovodrun" else "",
            "; left over: %s" % ", ".join(left) if left else ": nothing left over"), flush=True)
    return code


def leftovers(cluster):
    """What is left of ``cluster`` after its removal: namespaces, links, files of the
    run in the temp directory, processes whose command line names it."""
    left = cluster.leftovers()
    left += glob.glob(os.path.join(tempfile.gettempdir(), cluster.prefix + "-*"))
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(os.path.join("/proc", entry, "cmdline"), "rb") as f:
                if cluster.prefix.encode() in f.read():
                    left.append("process %s" % entry)
        except OSError:
            pass
    return left


if __name__ == "__main__":
    sys.exit(main())
