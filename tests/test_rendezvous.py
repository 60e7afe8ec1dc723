"""Restarting Horovod must not read the addresses of the world before it.

Horovod's own rendezvous server (the one ``horovodrun`` runs) is driven here
through the requests a Gloo init makes, in the order that leaves a scope
stale; then a real 2-rank job restarts over stale addresses.
"""

import urllib.request

import pytest

from tests import horovodrun
from tf_mergecomp import rendezvous
from tf_mergecomp.search import restart as horovod_restart

# Two ranks on one host: the scopes a Gloo init uses.
PLACEMENTS = [("localhost", 0), ("localhost", 1)]


@pytest.fixture
def server():
    from horovod.runner.common.util import hosts
    from horovod.runner.http.http_server import RendezvousServer

    rendezvous_server = RendezvousServer()
    port = rendezvous_server.start()
    rendezvous_server.init(hosts.get_host_assignments(hosts.parse_hosts("localhost:2"), 2))
    yield "127.0.0.1:%d" % port
    rendezvous_server.stop()


def _send(server, scope, key, method, data=None):
    request = urllib.request.Request("http://%s/%s/%s" % (server, scope, key), data=data,
                                     method=method)
    urllib.request.urlopen(request, timeout=5).read()


def _init_leaving_local_stale(server):
    """One Gloo init of 2 ranks, rank 0 finishing its one-rank cross scope
    between the two ranks' reports of the local one."""
    for scope, ranks in (("global", (0, 1)), ("local_localhost", (0, 1)),
                         ("cross_0", (0,)), ("cross_1", (0,))):
        for index, _ in enumerate(ranks):
            _send(server, scope, str(index), "PUT", b"address")
            _send(server, scope, "rank_%d" % index, "PUT", b"localhost")
    for scope, reporter in (("global", 0), ("global", 1), ("local_localhost", 0),
                            ("cross_0", 0), ("local_localhost", 1), ("cross_1", 0)):
        _send(server, scope, str(reporter), "DELETE")


def test_the_scopes_of_a_job():
    assert rendezvous.job_scopes(PLACEMENTS) == {
        "global": 2, "local_localhost": 2, "cross_0": 1, "cross_1": 1}
    assert rendezvous.job_scopes([("a", 0), ("a", 1), ("b", 0), ("b", 1)]) == {
        "global": 4, "local_a": 2, "local_b": 2, "cross_0": 2, "cross_1": 2}


def test_an_init_can_leave_a_scope_holding_old_addresses_and_it_is_emptied(server):
    _init_leaving_local_stale(server)
    scopes = rendezvous.job_scopes(PLACEMENTS)
    assert [s for s in scopes if rendezvous.scope_is_stale(server, s)] == ["local_localhost"]
    assert rendezvous.clear_stale_scopes(server, scopes) == (["local_localhost"], [])
    assert not any(rendezvous.scope_is_stale(server, s) for s in scopes)
    # Twice in a row (the first cleaning's report count forgotten by the second).
    _init_leaving_local_stale(server)
    _init_leaving_local_stale(server)
    assert rendezvous.clear_stale_scopes(server, scopes) == (["local_localhost"], [])
    assert rendezvous.clear_stale_scopes(server, scopes) == ([], [])


class _FakeRank0:
    """Rank 0 of 2 as clear_rendezvous sees it: its collectives answer alone."""

    def rank(self):
        return 0

    def size(self):
        return 2

    def local_rank(self):
        return 0

    def allgather_object(self, value, name=None):
        return PLACEMENTS

    def broadcast_object(self, value, root_rank=0, name=None):
        return value


def test_restart_is_refused_when_the_server_keeps_or_loses_the_addresses(server, monkeypatch):
    host, port = server.split(":")
    environ = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": host, "HOROVOD_GLOO_RENDEZVOUS_PORT": port}
    _init_leaving_local_stale(server)
    assert horovod_restart.clear_rendezvous(_FakeRank0(), environ) is None
    assert not rendezvous.scope_is_stale(server, "local_localhost")
    # A server that counts no report empties nothing: no restart, saying why.
    monkeypatch.setattr(rendezvous, "_REPORT_KEY", "x")
    monkeypatch.setattr(rendezvous, "_request", _ignoring_reports(rendezvous._request))
    _init_leaving_local_stale(server)
    problem = horovod_restart.clear_rendezvous(_FakeRank0(), environ)
    assert "kept the old addresses in scope local_localhost" in problem
    environ["HOROVOD_GLOO_RENDEZVOUS_PORT"] = "1"  # nothing listens there
    assert "did not answer" in horovod_restart.clear_rendezvous(_FakeRank0(), environ)


def _ignoring_reports(request):
    return lambda url, method: True if method == "DELETE" else request(url, method)


@pytest.mark.multiworker
def test_horovod_restarts_over_stale_addresses():
    # Rank 0 fills the global scope with unusable addresses of rank 1, which
    # restarts a second late: without the cleaning, rank 0's init reads them
    # and Gloo aborts the process.
    results, _ = horovodrun.run("restart_stale_rendezvous.py", timeout=180)
    for rank in (0, 1):
        (result,) = results[rank]
        assert result["restarts"] == 3 and result["summed"] == [3.0, 3.0, 3.0]
        assert result["stale_before"] == (rank == 0)
        assert result["problems"] == [None, None, None]
