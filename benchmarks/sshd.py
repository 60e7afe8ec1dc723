"""ssh servers in a VirtualCluster's namespaces, for the real ``horovodrun -H`` launch.

``SshServers(cluster)``, a context manager, makes everything in a temporary
directory of its own (mode 0700), and removes it on exit:

- a client key pair, and one host key per namespace (``ssh-keygen``, ed25519);
- per namespace, the distribution's ``sshd`` (package ``openssh-server``) in
  the foreground, listening on the namespace's address only, public-key
  authentication only (the run's client key), no PAM, no password, no
  forwarding. ``sshd`` needs its privilege-separation directory ``/run/sshd``;
  each server gets an empty ``/run`` (a tmpfs holding only that directory)
  in the mount namespace ``ip netns exec`` gives it, so nothing is made on the
  machine's own ``/run``. Processes started over ssh see that ``/run`` too;
- for the client side (``client_command``): an ssh client configuration
  (user, port, the run's key, a known-hosts file holding the servers' host
  keys, batch mode, connect and keep-alive timeouts) and a hosts file naming
  every worker. The launcher runs in a private mount namespace
  (``unshare --mount``) where these two files are bind-mounted over
  ``/etc/ssh/ssh_config`` and ``/etc/hosts``, and an empty file over
  ``~/.ssh/config`` if there is one, so that ``horovodrun`` and the ``ssh``
  it starts resolve the workers' names and trust their keys without a change
  to the machine's files or to the user's ``~/.ssh``.

On exit the ssh servers, their sessions and everything those started (ranks
of a launch that failed or timed out) are ended, and the directory removed.
Every wait is bounded. Needs root (namespaces, mounts), ``sshd``,
``ssh-keygen``, ``ssh`` and ``unshare``; on Debian/Ubuntu
``apt-get install openssh-server`` (``.ci/run`` does it on CI). With
``UsePAM no``, sshd refuses accounts whose password field is locked with
"!"; the user's shell runs the remote commands.
"""

import getpass
import os
import shutil
import socket
import subprocess
import tempfile
import time

from benchmarks import netns

SSH_PORT = 2222
_START_TIMEOUT_S = 30
_KEYGEN_TIMEOUT_S = 30
_STOP_WAIT_S = 10
INSTALL_HINT = ("apt-get install openssh-server (Debian/Ubuntu; .ci/run installs it on CI when "
                "run as root)")


class SshUnavailable(RuntimeError):
    """sshd or another tool this needs is missing."""


def find_sshd():
    """The sshd executable: on PATH, else where Debian/Ubuntu put it; None if missing."""
    found = shutil.which("sshd")
    if found:
        return found
    return "/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None


def available():
    """(bool, reason): whether ssh servers can be started in namespaces here."""
    ok, reason = netns.available()
    if not ok:
        return False, reason
    if find_sshd() is None:
        return False, "sshd not found: " + INSTALL_HINT
    for tool in ("ssh", "ssh-keygen", "unshare", "mount"):
        if shutil.which(tool) is None:
            return False, "%s not found" % tool
    if not os.path.exists("/etc/ssh/ssh_config"):
        return False, "/etc/ssh/ssh_config (openssh-client) not found"
    return True, ""


def _keygen(path, comment):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", path],
                   check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                   timeout=_KEYGEN_TIMEOUT_S)
    with open(path + ".pub") as f:
        return f.read().strip()


def _accepts(address, port):
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def _tail(path, lines=20):
    try:
        with open(path) as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


class SshServers:
    """One sshd per namespace of ``cluster`` (a created ``netns.VirtualCluster``).

    Attributes after ``start()``: ``directory`` (the run's files), ``port``,
    ``identity_file`` (the client's private key), ``user``, ``hosts`` (the
    workers' host names: the namespaces' names).
    """

    def __init__(self, cluster, port=SSH_PORT):
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError("ssh port must be an integer in 1..65535, got %r" % (port,))
        self.cluster = cluster
        self.port = port
        self.user = getpass.getuser()
        self.hosts = list(cluster.namespaces)
        self.directory = None
        self.identity_file = None
        self._servers = []

    def _path(self, name):
        return os.path.join(self.directory, name)

    def start(self):
        ok, reason = available()
        if not ok:
            raise SshUnavailable("cannot start ssh servers: %s" % reason)
        if not self.hosts:
            raise ValueError("the cluster has no namespaces; create() it first")
        self.directory = tempfile.mkdtemp(prefix="%s-ssh-" % self.cluster.prefix)
        self.identity_file = self._path("id_ed25519")
        client_key = _keygen(self.identity_file, "horovodrun@" + self.cluster.prefix)
        with open(self._path("authorized_keys"), "w") as f:
            f.write(client_key + "\n")
        known_hosts = []
        for rank, (host, address) in enumerate(zip(self.hosts, self.cluster.addresses)):
            host_key = self._path("host%d_ed25519" % rank)
            public = _keygen(host_key, "sshd@" + host)
            known_hosts.append("[%s]:%d,[%s]:%d %s" % (host, self.port, address, self.port,
                                                        " ".join(public.split()[:2])))
            config = self._path("sshd%d_config" % rank)
            with open(config, "w") as f:
                f.write(self._server_config(address, host_key))
            self._servers.append(self._start_server(rank, config))
        with open(self._path("known_hosts"), "w") as f:
            f.write("\n".join(known_hosts) + "\n")
        with open(self._path("ssh_config"), "w") as f:
            f.write(self._client_config())
        with open(self._path("hosts"), "w") as f:
            f.write(self._hosts_file())
        self._wait_until_listening()
        return self

    def _server_config(self, address, host_key):
        return "\n".join([
            "ListenAddress %s:%d" % (address, self.port),
            "HostKey " + host_key,
            "AuthorizedKeysFile " + self._path("authorized_keys"),
            "AllowUsers " + self.user,
            "AuthenticationMethods publickey",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password",
            "UsePAM no",
            # The run's directory is 0700 and owned by us; the default check
            # of every parent directory would refuse /tmp (world-writable).
            "StrictModes no",
            "PidFile none",
            "AllowTcpForwarding no",
            "AllowAgentForwarding no",
            "X11Forwarding no",
            "PermitTTY no",
            "PrintMotd no",
            "MaxStartups 200",
            "MaxSessions 200",
            "LogLevel ERROR",
            "",
        ])

    def _client_config(self):
        return "\n".join([
            "Host *",
            "  User " + self.user,
            "  Port %d" % self.port,
            "  IdentityFile " + self.identity_file,
            "  IdentitiesOnly yes",
            "  UserKnownHostsFile " + self._path("known_hosts"),
            "  GlobalKnownHostsFile /dev/null",
            "  CheckHostIP no",
            "  BatchMode yes",
            "  ConnectTimeout 10",
            "  ServerAliveInterval 10",
            "  ServerAliveCountMax 6",
            "  LogLevel ERROR",
            "",
        ])

    def _hosts_file(self):
        with open("/etc/hosts") as f:
            machine = f.read()
        entries = "".join("%s %s\n" % (address, host)
                          for host, address in zip(self.hosts, self.cluster.addresses))
        return machine.rstrip("\n") + "\n# workers of the virtual cluster %s\n%s" % (
            self.cluster.prefix, entries)

    def _start_server(self, rank, config):
        log_path = self._path("sshd%d.log" % rank)
        # A /run of its own (tmpfs, only in this namespace's mount namespace)
        # holding sshd's privilege-separation directory.
        script = ('mount -t tmpfs -o size=1m,mode=0755 tmpfs /run && mkdir -m 0755 /run/sshd '
                  '&& exec "$0" -D -e -f "$1"')
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                self.cluster.exec_prefix(rank) + ["sh", "-c", script, find_sshd(), config],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        return process, log_path

    def _wait_until_listening(self):
        deadline = time.monotonic() + _START_TIMEOUT_S
        pending = list(range(len(self._servers)))
        while pending:
            for rank in list(pending):
                process, log_path = self._servers[rank]
                if process.poll() is not None:
                    raise SshUnavailable("sshd in %s exited with %s:\n%s" % (
                        self.hosts[rank], process.returncode, _tail(log_path)))
                if _accepts(self.cluster.addresses[rank], self.port):
                    pending.remove(rank)
            if pending and time.monotonic() > deadline:
                raise SshUnavailable("sshd in %s not listening after %d s:\n%s" % (
                    self.hosts[pending[0]], _START_TIMEOUT_S, _tail(self._servers[pending[0]][1])))
            if pending:
                time.sleep(0.1)

    def client_command(self, argv):
        """``argv`` run with this run's ssh client configuration and hosts file (module docstring)."""
        mounts = [(self._path("hosts"), "/etc/hosts"),
                  (self._path("ssh_config"), "/etc/ssh/ssh_config")]
        user_config = os.path.join(os.path.expanduser("~" + self.user), ".ssh", "config")
        if os.path.exists(user_config):
            mounts.append(("/dev/null", user_config))
        script = " && ".join('mount --bind "$%d" "$%d"' % (2 * i + 1, 2 * i + 2)
                             for i in range(len(mounts)))
        script += ' && shift %d && exec "$@"' % (2 * len(mounts))
        return (["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]
                + [path for mount in mounts for path in mount] + list(argv))

    def logs(self):
        """The servers' log tails (sshd logs errors only)."""
        return {host: _tail(log_path) for host, (_, log_path) in zip(self.hosts, self._servers)}

    def end_sessions(self):
        """Ends every process of the cluster's namespaces but the ssh servers: the
        sessions and ranks a failed or timed-out launch leaves behind."""
        netns.kill_namespace_processes(self.cluster.namespaces,
                                       spare={process.pid for process, _ in self._servers})

    def stop(self):
        """Ends the servers and all processes of the cluster's namespaces; removes the run's files."""
        for process, _ in self._servers:
            process.terminate()
        for process, _ in self._servers:
            try:
                process.wait(timeout=_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=_STOP_WAIT_S)
        self._servers = []
        netns.kill_namespace_processes(self.cluster.namespaces)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()
        return False
