"""A virtual cluster: one network namespace per worker, joined by a bridge.

Topology for W workers (names carry a prefix unique to the owning process)::

    root namespace:  bridge <prefix>br  (address .1 of a private /24)
                       |-- veth <prefix>h<i>  --(pair)-- <prefix>n<i> in namespace <prefix>w<i>
                                                          (address .(10+i))

Every veth end is shaped with a token-bucket filter (``tc qdisc ... tbf``), so
each worker's uplink (namespace side, egress) and downlink (bridge side,
egress) carry at most ``bandwidth``: the bridge acts as a non-blocking switch
with one shaped port per worker, like a rack of machines on one switch.

Horovod's per-process-set Gloo contexts ignore HOROVOD_GLOO_IFACE and bind
to whatever the machine's hostname resolves to (127.0.0.1 here), which
namespaces cannot reach across. ``ip netns exec`` bind-mounts
``/etc/netns/<namespace>/hosts`` over ``/etc/hosts``, so each namespace gets a
hosts file mapping the hostname to its own address (and every worker's
namespace name to that worker's address, as a cluster's DNS would).

The interface inside every namespace carries the bridge's name: ``horovodrun``
gives the ranks, as the rendezvous address, the launching host's address on
the interface the workers have in common, so the launcher (in the root
namespace, on the bridge) and the workers must share that interface name.

Processes still running in a cluster's namespaces when it is removed (ranks
of a killed launch, ssh servers and their sessions) are ended first.

Names are ``mcb<pid as 6 hex digits>...``: a later run removes what a dead
process left behind (``cleanup_stale``) without touching clusters of live
processes. Every ``ip``/``tc`` call has a timeout. Needs root and iproute2.
"""

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time

NAME_ROOT = "mcb"
_COMMAND_TIMEOUT_S = 20
_PREFIX_PATTERN = re.compile(r"^(%s)([0-9a-f]{6})" % NAME_ROOT)
_RATE_PATTERN = re.compile(r"^\d+(\.\d+)?(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$")


class Terminated(BaseException):
    """SIGTERM/SIGHUP arrived; raised so that every ``finally`` and ``__exit__`` runs."""


def _raise_terminated(signum, frame):
    raise Terminated("signal %d" % signum)


@contextlib.contextmanager
def terminate_cleanly():
    """Turns SIGTERM and SIGHUP into a ``Terminated`` exception inside the block.

    Ctrl-C already raises KeyboardInterrupt; with this, ``kill`` does the same,
    so a VirtualCluster's ``__exit__`` removes its namespaces either way.
    """
    previous = {s: signal.signal(s, _raise_terminated) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class NetnsUnavailable(RuntimeError):
    """Root or iproute2 is missing, so namespaces cannot be made here."""


def check_rate(rate):
    """tc rate spelling ('1gbit', '100mbit'); None or 'none' means unshaped."""
    if rate is None or rate == "none":
        return None
    if not isinstance(rate, str) or not _RATE_PATTERN.match(rate.lower()):
        raise ValueError(
            "bandwidth must be a tc rate such as 1gbit, 100mbit, 10gbit, or 'none', got %r" % (rate,)
        )
    return rate.lower()


_TC_UNITS = {"bit": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
             "bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "tbps": 1e12}


def rate_bytes_per_s(rate):
    """Bytes per second of a tc rate, as tc reads it ('gbit' bits, 'gbps' bytes)."""
    rate = check_rate(rate)
    if rate is None:
        raise ValueError("an unshaped link ('none') has no rate")
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)([a-z]+)", rate).groups()
    return float(number) * _TC_UNITS[unit]


def available():
    """(bool, reason): whether this process can create namespaces."""
    if os.geteuid() != 0:
        return False, "not root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, "%s (iproute2) not found" % tool
    return True, ""


def _run(args, check=True):
    result = subprocess.run(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=_COMMAND_TIMEOUT_S
    )
    if check and result.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (" ".join(args), result.returncode, result.stderr.strip()))
    return result


def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def list_namespaces():
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def list_links():
    out = _run(["ip", "-o", "link", "show"], check=False).stdout
    names = []
    for line in out.splitlines():
        # "12: mcb00abcdh0@if11: <...>"
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@")[0])
    return names


def list_etc_dirs():
    try:
        return sorted(os.listdir(_NETNS_ETC))
    except OSError:
        return []


def owned_names(prefix):
    """Namespaces (with /etc/netns entries) and root-namespace links named prefix*."""
    namespaces = set(n for n in list_namespaces() + list_etc_dirs() if n.startswith(prefix))
    return sorted(namespaces), [n for n in list_links() if n.startswith(prefix)]


_NETNS_ETC = "/etc/netns"


def _remove_etc(namespaces):
    for name in namespaces:
        shutil.rmtree(os.path.join(_NETNS_ETC, name), ignore_errors=True)
    try:
        os.rmdir(_NETNS_ETC)  # only when empty: other tools may keep files there
    except OSError:
        pass


def _write_hosts(namespace, address, workers):
    """``workers``: (name, address) of every worker of the cluster."""
    directory = os.path.join(_NETNS_ETC, namespace)
    os.makedirs(directory, exist_ok=True)
    hostname = socket.gethostname()
    with open(os.path.join(directory, "hosts"), "w") as f:
        f.write("127.0.0.1 localhost\n%s %s\n" % (address, hostname))
        f.writelines("%s %s\n" % (worker_address, name) for name, worker_address in workers)


_KILL_WAIT_S = 5


def namespace_pids(namespace):
    out = _run(["ip", "netns", "pids", namespace], check=False).stdout
    return [int(pid) for pid in out.split() if pid.isdigit()]


def running(pid):
    """Whether ``pid`` exists and is not a zombie (an ended child not yet waited for)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_namespace_processes(namespaces, spare=()):
    """Ends every process in ``namespaces`` but the pids in ``spare``: SIGTERM, then
    SIGKILL after a few seconds."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        pids = [pid for ns in namespaces for pid in namespace_pids(ns) if pid not in spare]
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + _KILL_WAIT_S
        while pids and time.monotonic() < deadline:
            pids = [pid for pid in pids if running(pid)]
            time.sleep(0.1)
        if not pids:
            return


def _remove(namespaces, links):
    # Deleting a namespace destroys the veth end inside it and so its peer;
    # links are removed afterwards only if something is left.
    existing = set(list_namespaces())
    kill_namespace_processes([name for name in namespaces if name in existing])
    for name in namespaces:
        if name in existing:
            _run(["ip", "netns", "del", name], check=False)
    _remove_etc(namespaces)
    remaining = set(list_links())
    for name in links:
        if name in remaining:
            _run(["ip", "link", "del", name], check=False)


def cleanup_stale():
    """Removes clusters whose creating process is gone. Returns the names removed."""
    ok, _ = available()
    if not ok:
        return []
    namespaces = sorted(set(list_namespaces() + list_etc_dirs()))
    links = list_links()
    stale_prefixes = set()
    for name in namespaces + links:
        match = _PREFIX_PATTERN.match(name)
        if match and not _pid_alive(int(match.group(2), 16)):
            stale_prefixes.add(match.group(0))
    removed = []
    for prefix in sorted(stale_prefixes):
        ns = [n for n in namespaces if n.startswith(prefix)]
        ln = [n for n in links if n.startswith(prefix)]
        _remove(ns, ln)
        removed.extend(ns + ln)
    return removed


def _free_subnet():
    """A 10.213.x.0/24 not routed yet in the root namespace."""
    routes = _run(["ip", "-4", "route", "show"], check=False).stdout
    addresses = _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
    for third in range(10, 250):
        net = "10.213.%d." % third
        if net not in routes and net not in addresses:
            return net
    raise RuntimeError("no free 10.213.x.0/24 subnet for the virtual cluster")


class VirtualCluster:
    """W namespaces on one bridge; use as a context manager (removes everything on exit).

    Attributes after ``create()``: ``namespaces`` (list of names, also the
    workers' host names), ``addresses`` (worker IPs), ``server_address`` (the
    bridge IP, for the rendezvous server), ``iface`` (the interface name inside
    every namespace: the bridge's name).
    """

    def __init__(self, workers, bandwidth="1gbit", burst="256kb", latency="50ms", tag=None):
        if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 64:
            raise ValueError("workers must be an integer in 1..64, got %r" % (workers,))
        self.workers = workers
        self.bandwidth = check_rate(bandwidth)
        self.burst = burst
        self.latency = latency
        # pid in the name lets cleanup_stale tell live clusters from leftovers;
        # the tag keeps two clusters of one process apart.
        self.prefix = "%s%06x%s" % (NAME_ROOT, os.getpid() & 0xFFFFFF, tag if tag is not None else "")
        if len(self.prefix) + 4 > 15:
            raise ValueError("tag %r makes interface names longer than 15 characters" % (tag,))
        self.namespaces = []
        self.addresses = []
        self.server_address = None
        self.iface = self.bridge
        self._created = False

    @property
    def bridge(self):
        return self.prefix + "br"

    def _host_veth(self, i):
        return "%sh%d" % (self.prefix, i)

    def _ns_veth(self, i):
        return "%sn%d" % (self.prefix, i)

    def _shape(self, device, namespace=None):
        if self.bandwidth is None:
            return
        cmd = ["tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", self.bandwidth,
               "burst", self.burst, "latency", self.latency]
        _run(["ip", "netns", "exec", namespace] + cmd if namespace else cmd)

    def create(self):
        ok, reason = available()
        if not ok:
            raise NetnsUnavailable("cannot build a virtual cluster: %s" % reason)
        self._created = True
        subnet = _free_subnet()
        self.server_address = subnet + "1"
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        _run(["ip", "addr", "add", self.server_address + "/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        workers = [("%sw%d" % (self.prefix, i), "%s%d" % (subnet, 10 + i))
                   for i in range(self.workers)]
        for i, (ns, address) in enumerate(workers):
            self.namespaces.append(ns)
            _write_hosts(ns, address, workers)
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", self._host_veth(i), "type", "veth", "peer", "name", self._ns_veth(i)])
            _run(["ip", "link", "set", self._host_veth(i), "master", self.bridge])
            _run(["ip", "link", "set", self._host_veth(i), "up"])
            _run(["ip", "link", "set", self._ns_veth(i), "netns", ns])
            inside = ["ip", "netns", "exec", ns]
            _run(inside + ["ip", "link", "set", self._ns_veth(i), "name", self.iface])
            _run(inside + ["ip", "addr", "add", address + "/24", "dev", self.iface])
            _run(inside + ["ip", "link", "set", self.iface, "up"])
            _run(inside + ["ip", "link", "set", "lo", "up"])
            self._shape(self._host_veth(i))
            self._shape(self.iface, namespace=ns)
            self.addresses.append(address)
        return self

    def exec_prefix(self, rank):
        """Command prefix that runs a program inside worker ``rank``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[rank]]

    def destroy(self):
        if not self._created:
            return
        namespaces, links = owned_names(self.prefix)
        _remove(namespaces, links)
        self.namespaces = []
        self.addresses = []
        self._created = False

    def leftovers(self):
        """Names with this cluster's prefix still present (empty after destroy)."""
        namespaces, links = owned_names(self.prefix)
        return namespaces + links

    def __enter__(self):
        try:
            return self.create()
        except BaseException:
            self.destroy()
            raise

    def __exit__(self, *exc):
        self.destroy()
        return False
