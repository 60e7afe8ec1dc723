"""The multi-host launch path: the main job under the real ``horovodrun -H`` over ssh,
across two network namespaces (root, iproute2 and openssh-server; .ci/run installs it)."""

import os
import re
import subprocess
import sys

import pytest

from benchmarks import launcher, netns, sshd

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

needs_sshd = pytest.mark.skipif(not sshd.available()[0],
                                reason="needs root, iproute2 and openssh-server: %s"
                                       % sshd.available()[1])


@pytest.mark.multiworker
@needs_sshd
def test_main_job_trains_across_namespaces_under_horovodrun_over_ssh():
    home_ssh = os.path.expanduser("~/.ssh")
    had_home_ssh = os.path.exists(home_ssh)
    command = [sys.executable, "-m", "benchmarks.launcher", "--launcher", "horovodrun",
               "--workers", "2", "--timeout", "420", "examples/train_digits.py", "--epochs", "3",
               "--no-search"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=540,
                          env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    launched = re.search(r"\[launcher\] 2 namespaces (\S+), (\S+) at (\S+), (\S+),", output)
    namespaces, addresses = launched.group(1, 2), launched.group(3, 4)
    # The real horovodrun, one slot on each namespace's host, over the run's ssh key.
    launch = re.search(r"^\$ (.*)$", output, re.M).group(1).split()
    assert os.path.basename(launch[0]) == "horovodrun"
    assert launch[launch.index("-H") + 1] == "%s:1,%s:1" % namespaces
    assert "--ssh-identity-file" in launch and "--ssh-port" in launch
    # Both ranks trained, each on its own host (namespace address), to the same weights.
    ranks = {rank: (address, checksum) for rank, address, checksum in re.findall(
        r"^\[(\d)\]<stdout>:rank \1 of 2 on \S+ \(([\d.]+)\): trained on \d+ images, "
        r"weights checksum (\S+)$", output, re.M)}
    assert sorted(ranks) == ["0", "1"], output[-4000:]
    assert (ranks["0"][0], ranks["1"][0]) == addresses
    assert ranks["0"][1] == ranks["1"][1]
    assert "[0]<stdout>:weights identical on all 2 ranks: yes" in output
    accuracy = float(re.search(r"\[0\]<stdout>:test loss [\d.]+, test accuracy ([\d.]+)",
                               output).group(1))
    assert accuracy > 0.8, output[-3000:]
    # Everything made for the run is gone: namespaces, links, ssh servers, keys.
    assert "nothing left over" in output, output[-2000:]
    prefix = re.search(r"removed the cluster (\S+)", output).group(1)
    assert netns.owned_names(prefix) == ([], [])
    assert os.path.exists(home_ssh) == had_home_ssh  # the user's ~/.ssh untouched


@pytest.mark.multiworker
@needs_sshd
def test_ssh_servers_accept_only_the_runs_key_and_are_removed():
    with netns.VirtualCluster(1, bandwidth=None, tag="k") as cluster:
        with sshd.SshServers(cluster) as servers:
            directory = servers.directory
            host = servers.hosts[0]
            ran = subprocess.run(servers.client_command(["ssh", host, "echo $SSH_CONNECTION"]),
                                 capture_output=True, text=True, timeout=60)
            assert ran.returncode == 0, ran.stderr
            assert ran.stdout.split()[2] == cluster.addresses[0]  # the server's own address
            # Another key (host key trusted, no password possible): refused.
            other_key = os.path.join(directory, "other_ed25519")
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", other_key],
                           check=True, timeout=30)
            refused = subprocess.run(
                ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                 "-o", "UserKnownHostsFile=" + os.path.join(directory, "known_hosts"),
                 "-p", str(servers.port), "-i", other_key, cluster.addresses[0], "true"],
                capture_output=True, text=True, timeout=60)
            assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused
            pids = [pid for pid in netns.namespace_pids(cluster.namespaces[0])]
            assert pids
        assert not os.path.exists(directory)
        assert not any(netns.running(pid) for pid in pids)


def test_launcher_choice_is_checked():
    with pytest.raises(ValueError, match="direct, horovodrun"):
        with launcher.open_launcher("mpirun", cluster=None):
            pass
    with pytest.raises(ValueError, match="1..65535"):
        sshd.SshServers(netns.VirtualCluster(1), port=0)


@pytest.mark.multiworker
@needs_sshd
def test_two_namespaces_of_two_ranks_are_two_machines_to_horovod():
    """horovodrun -np 4 -H ns0:2,ns1:2 over ssh (about 45 s on 2 busy cores): every rank
    reports local size 2 and cross size 2, ranks 0-1 on the first namespace, 2-3 on the
    second, and an allreduce across both sums all four ranks."""
    command = [sys.executable, "-m", "benchmarks.launcher", "--launcher", "horovodrun",
               "--workers", "2", "--ranks-per-machine", "2", "--timeout", "200",
               "tests/workers/machine_layout.py"]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    namespaces = re.search(r"\[launcher\] 2 namespaces (\S+), (\S+) at", output).group(1, 2)
    launch = re.search(r"^\$ (.*)$", output, re.M).group(1).split()
    assert launch[launch.index("-np") + 1] == "4"
    assert launch[launch.index("-H") + 1] == "%s:2,%s:2" % namespaces
    seen = {int(rank): fields for rank, *fields in re.findall(
        r"^\[(\d)\]<stdout>:rank \1 of 4: local (\d)/(\d) cross (\d)/(\d) on (\S+), "
        r"sum of ranks (\d+)$", output, re.M)}
    assert sorted(seen) == [0, 1, 2, 3], output[-4000:]
    for rank, (local_rank, local_size, cross_rank, cross_size, host, total) in seen.items():
        assert (int(local_rank), int(cross_rank)) == (rank % 2, rank // 2)
        assert (local_size, cross_size, total) == ("2", "2", "6")
        assert host == namespaces[rank // 2]
    assert "nothing left over" in output, output[-2000:]
