"""The launcher's Gloo rendezvous store, left clean for the next ``hvd.init()``.

A Gloo-controlled Horovod world is built at ``hvd.init()`` through the
launcher's HTTP key-value store (``horovodrun``'s rendezvous server): in each
of three scopes, ``global``, ``local_<host>`` and ``cross_<local rank>``,
every rank writes its addresses, reads its peers' and, once connected,
reports the scope finished (an HTTP DELETE). The server empties a scope once
as many ranks as the scope holds have reported it, but emptying any scope
also forgets how many had reported the others (Horovod 0.28.1, the
rendezvous handler's DELETE). A rank that finishes a small scope (its
one-rank ``cross_0``) between two ranks' reports of a larger one
(``local_<host>``) thus leaves the larger one holding the addresses of the
world just built. At the next init a rank may read a peer's old address
before the peer replaces it, and Gloo aborts the process (``Connection
refused``; docs/search.md, "Horovod restarts between candidates").

``clear_stale_scopes`` empties such scopes before a restart: one rank,
while the others wait, reports each stale scope finished until it is empty
(a scope that completes normally is emptied at once, so one of its keys
tells whether it is stale).
"""

import time
import urllib.error
import urllib.request

# Each rank writes its address under its rank, and (newer Gloo) its host
# name under "rank_<rank>": rank 0 of a scope writes both names or one.
_PROBE_KEYS = ("0", "rank_0")
# The name a cleaning report gives; the server only counts reports.
_REPORT_KEY = "tf_mergecomp_clear"
REQUEST_TIMEOUT_S = 5.0


def job_scopes(placements):
    """{scope: number of ranks in it} for ranks placed at ``placements``:
    one (host name, local rank) per global rank, in rank order."""
    scopes = {"global": len(placements)}
    for host, local_rank in placements:
        for scope in ("local_%s" % host, "cross_%d" % local_rank):
            scopes[scope] = scopes.get(scope, 0) + 1
    return scopes


def _request(url, method):
    """True when the server has the key (GET) or took the request."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
            response.read()
        return True
    except urllib.error.HTTPError as error:
        if error.code == 404:
            return False
        raise


def scope_is_stale(server, scope):
    """Whether ``scope`` still holds a key (a scope no rendezvous is using)."""
    return any(_request("http://%s/%s/%s" % (server, scope, key), "GET") for key in _PROBE_KEYS)


def clear_stale_scopes(server, scopes, deadline_s=30.0):
    """Empties every stale scope of ``scopes`` ({scope: size}) on the
    rendezvous server ``server`` ("host:port"). Call it from one rank while no
    rank is initializing Horovod. Returns the stale scopes found and the
    scopes it could not empty (both lists of names)."""
    deadline = time.monotonic() + deadline_s
    found, left = [], []
    for scope, size in sorted(scopes.items()):
        if not scope_is_stale(server, scope):
            continue
        found.append(scope)
        # At most ``size`` reports complete the count, whatever part of it
        # the server still remembers.
        stale = True
        for _ in range(size):
            _request("http://%s/%s/%s" % (server, scope, _REPORT_KEY), "DELETE")
            stale = scope_is_stale(server, scope)
            if not stale or time.monotonic() > deadline:
                break
        if stale:
            left.append(scope)
    return found, left
