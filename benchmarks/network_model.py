"""The network of the simulated cluster: what W workers' collectives cost.

Cost functions for the step-time model (``tf_mergecomp.search.step_model``):
``NetworkCosts`` (ring allreduce and allgather with their latency terms),
``WireBytes`` (a codec's bytes on the wire per group), ``NetworkGroupCosts``
(a codec's measured parts plus W workers' network), ``FusedGroupCosts``
(Horovod's fused per-tensor allreduces, laid out by ``tf_mergecomp.grouping.fusion_splits``)
and ``SerializedExchange`` (any of them on the compute stream). Only the
simulator (benchmarks/simulate.py) and the profiles use them; the partition
search itself predicts from measurements alone.
"""


import numpy as np

from tf_mergecomp.compressors.base import ALLGATHER, ALLREDUCE
from tf_mergecomp.search import settings as search_settings


COLLECTIVE_KINDS = (ALLREDUCE, ALLGATHER)
# The paper profile's fusion buffer (Horovod's default before 0.21; a measured
# profile records the job's, tf_mergecomp/search/settings.py).
HOROVOD_FUSION_BYTES = 64 * 2**20
HOROVOD_CYCLE_S = search_settings.HOROVOD_CYCLE_S


def horovod_cycle_s(environ=None):
    """Horovod's cycle in seconds as the processes started from ``environ`` (default:
    this one's) will run it: HOROVOD_CYCLE_TIME (milliseconds) if set, else the default."""
    return search_settings.horovod_fusion(environ)[0]


def check_collective(kind):
    if kind not in COLLECTIVE_KINDS:
        raise ValueError("unknown collective %r; valid choices: %s"
                         % (kind, ", ".join(COLLECTIVE_KINDS)))
    return kind


class NetworkCosts:
    """Seconds of one collective on ``workers`` workers joined in a ring.

    Each worker's link moves ``bandwidth`` bytes per second each way, and each
    of a ring's steps costs ``latency`` seconds more. For ``nbytes`` per worker:

      ring allreduce  2 (W - 1) / W * nbytes / bandwidth + 2 (W - 1) * latency
                      (reduce-scatter, then allgather, W - 1 steps each)
      allgather       (W - 1) * nbytes / bandwidth + (W - 1) * latency
                      (every worker receives the W - 1 other rows)

    One worker moves nothing (0 s). Array ``nbytes`` give arrays.
    """

    def __init__(self, workers, bandwidth, latency=0.0):
        if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 1:
            raise ValueError("workers must be an integer >= 1, got %r" % (workers,))
        if not bandwidth > 0:
            raise ValueError("bandwidth must be positive bytes per second, got %r" % (bandwidth,))
        if not latency >= 0:
            raise ValueError("latency must be non-negative seconds, got %r" % (latency,))
        self.workers = int(workers)
        self.bandwidth = float(bandwidth)
        self.latency = float(latency)

    def allreduce(self, nbytes):
        return self.collective(ALLREDUCE, nbytes)

    def allgather(self, nbytes):
        return self.collective(ALLGATHER, nbytes)

    def transfer(self, kind, nbytes):
        """The bandwidth term of one collective of ``kind`` over ``nbytes`` per worker."""
        nbytes = np.asarray(nbytes, dtype=np.float64)
        return self._ring_share(kind, self.workers) * nbytes / self.bandwidth

    def latency_term(self, kind):
        """Its latency term: the ring's steps."""
        return self._ring_steps(kind, self.workers) * self.latency

    def host_scale(self, kind, probe_workers):
        """How much more of a collective's per-byte host work (reduction, copies)
        each worker does here than in a probe on ``probe_workers`` ranks: a ring
        allreduce handles 2 (W - 1) / W of the bytes per worker, an allgather
        receives W - 1 rows. 1 when the probe ran alone (it measured no such work)."""
        if probe_workers <= 1:
            return 1.0
        return self._ring_share(kind, self.workers) / self._ring_share(kind, probe_workers)

    @staticmethod
    def _ring_share(kind, workers):
        if kind == ALLREDUCE:
            return 2.0 * (workers - 1) / workers
        check_collective(kind)
        return float(workers - 1)

    @staticmethod
    def _ring_steps(kind, workers):
        return (2.0 if kind == ALLREDUCE else 1.0) * (workers - 1)

    def collective(self, kind, nbytes):
        check_collective(kind)
        return self.transfer(kind, nbytes) + self.latency_term(kind)


class WireBytes:
    """Bytes one worker sends for a group: fixed + per_element * elements +
    the tensors' own extra bytes (``tensor_bytes``, per tensor, for codecs
    whose payload is per tensor, such as random-k's k values per tensor)."""

    def __init__(self, sizes, fixed=0.0, per_element=4.0, tensor_bytes=None):
        self.sizes = np.asarray(sizes, dtype=np.float64)
        self.cumulative = np.concatenate([[0.0], np.cumsum(self.sizes)])
        self.fixed = float(fixed)
        self.per_element = float(per_element)
        extra = np.zeros(len(self.sizes)) if tensor_bytes is None else np.asarray(
            tensor_bytes, dtype=np.float64)
        if extra.shape != self.sizes.shape:
            raise ValueError("tensor_bytes must list one value per tensor")
        self.tensor_cumulative = np.concatenate([[0.0], np.cumsum(extra)])

    def __call__(self, lo, hi):
        lo = np.asarray(lo)
        hi = np.asarray(hi)
        return (self.fixed + self.per_element * (self.cumulative[hi] - self.cumulative[lo])
                + self.tensor_cumulative[hi] - self.tensor_cumulative[lo])


class NetworkGroupCosts:
    """A group's (encode, collective, decode) seconds on a network of W workers.

    The codec's own parts come from ``codec`` (a LinearGroupCosts or any cost
    function, as measured on one worker: its collective part is the host's
    cost of handing a collective to Horovod and back, kept); the collective
    adds ``calls`` collectives of ``kind`` over ``wire(lo, hi)`` bytes on
    ``network`` (Horovod's cycle is the StepTimeModel's ``cycle_s``). With ``decode_rows`` the
    decode's per-element cost is paid once per worker's row (an allgather's
    decode reads W payloads; measured on ``probe_workers`` it read that many).
    ``probe_workers`` > 1: the codec's collective part was measured on that
    many ranks, its per-element term being the host's share of the collective
    (``NetworkCosts.host_scale`` scales it to W workers); ``probe_link``, the
    bytes per second each way the probe's own ring delivered, takes the probe's
    transfer out of that share (``_host_share``).
    """

    def __init__(self, codec, wire, kind, network, calls=1, decode_rows=False,
                 probe_workers=1, probe_link=None):
        check_collective(kind)
        self.codec = codec
        self.wire = wire
        self.kind = kind
        self.network = network
        self.calls = int(calls)
        self.decode_rows = bool(decode_rows)
        self.probe_workers = max(1, int(probe_workers))
        self.host_scale = network.host_scale(kind, self.probe_workers)
        self.probe_network = _probe_network(self.probe_workers, probe_link)

    def __call__(self, lo, hi):
        encode, local, decode = (np.asarray(p, dtype=np.float64) for p in self.codec(lo, hi))
        nbytes = self.wire(lo, hi) / self.calls
        host_bytes = per_element_part(self.codec, 1, lo, hi)
        host = self.calls * _host_share(host_bytes / self.calls, self.probe_network, self.kind,
                                        nbytes)
        collective = (local - host_bytes + self.host_scale * host
                      + self.calls * self.network.collective(self.kind, nbytes))
        extra_rows = self.network.workers - self.probe_workers
        if self.decode_rows and extra_rows:
            per_row = per_element_part(self.codec, 2, lo, hi) / self.probe_workers
            decode = decode + extra_rows * per_row
        return encode, collective, decode


def _host_share(host_s, probe_network, kind, nbytes):
    """The host's per-byte share of a collective measured on several ranks,
    less the time its probe's transport took to move ``nbytes`` (at
    ``probe_network``'s rate, what the probe's own link delivered; None: not
    measured, nothing taken off). That transport is the probe's network, and
    the simulated network replaces it: added to the network's time it priced
    a 59 MB allreduce's bytes twice at 10 Gbit/s on a 2-core host, where
    loopback and the shaped links alike move bytes at the rate the cores copy
    them (docs/scaling.md, section 3)."""
    if probe_network is None:
        return host_s
    return np.maximum(0.0, host_s - probe_network.transfer(kind, nbytes))


def _probe_network(probe_workers, probe_link):
    """The ring the probe's collectives ran on: ``probe_link`` bytes per second
    each way between ``probe_workers`` ranks; None when it moved nothing (one
    rank) or its rate was not measured."""
    if probe_workers <= 1 or not probe_link:
        return None
    return NetworkCosts(probe_workers, probe_link)


def per_element_part(codec, part, lo, hi):
    """The per-element term of one part (0 encode, 1 collective, 2 decode) of a
    LinearGroupCosts for groups [lo, hi) (of a MeasuredGroupCosts: its fit's);
    0 for cost functions without one."""
    codec = getattr(codec, "fitted", codec)
    coefficients = getattr(codec, "coefficients", None)
    if coefficients is None:
        return 0.0
    elements = codec.cumulative[np.asarray(hi)] - codec.cumulative[np.asarray(lo)]
    return coefficients[part, 1] * elements


class SerializedExchange:
    """Costs of an exchange that cannot overlap compute: each group's collective is
    charged to its encode, so that, in a StepTimeModel with ``codec_on_compute``,
    it runs on the compute stream right after the encode and delays backprop by
    its whole duration. A hypothesis about a host, not a measurement: a GPU whose
    collectives hold the SMs or the memory path that backprop needs (the MergeComp
    paper's PCIe figures are consistent with it: docs/scaling.md, section 4).
    Wraps any cost function."""

    def __init__(self, costs):
        self.costs = costs

    def __call__(self, lo, hi):
        encode, collective, decode = (np.asarray(p, dtype=np.float64)
                                      for p in self.costs(lo, hi))
        return encode + collective, np.zeros_like(collective), decode


class FusedGroupCosts:
    """Costs of groups fused by Horovod (``tf_mergecomp.grouping.fusion_splits``): per group,
    the per-tensor codec costs summed (Horovod casts tensor by tensor), and
    one collective of the group's bytes (``probe_workers`` and ``probe_link``
    as in NetworkGroupCosts)."""

    def __init__(self, codec, wire, kind, network, probe_workers=1, probe_link=None):
        check_collective(kind)
        self.codec = codec
        self.wire = wire
        self.kind = kind
        self.network = network
        probe_workers = max(1, int(probe_workers))
        self.host_scale = network.host_scale(kind, probe_workers)
        self.probe_network = _probe_network(probe_workers, probe_link)
        n = len(wire.sizes)
        parts = [np.broadcast_to(np.asarray(p, dtype=np.float64), (n,))
                 for p in codec(np.arange(n), np.arange(1, n + 1))]
        self._cumulative = [np.concatenate([[0.0], np.cumsum(p)]) for p in parts]
        # The host's per-collective cost is paid once per fused collective, its
        # per-byte share (measured on several ranks) once per byte.
        host_bytes = per_element_part(codec, 1, np.arange(n), np.arange(1, n + 1))
        self._local_fixed = float((parts[1] - host_bytes).min()) if n else 0.0

    def __call__(self, lo, hi):
        lo = np.asarray(lo)
        hi = np.asarray(hi)
        encode = self._cumulative[0][hi] - self._cumulative[0][lo]
        decode = self._cumulative[2][hi] - self._cumulative[2][lo]
        nbytes = self.wire(lo, hi)
        host = _host_share(per_element_part(self.codec, 1, lo, hi), self.probe_network,
                           self.kind, nbytes)
        collective = (self._local_fixed + self.host_scale * host
                      + self.network.collective(self.kind, nbytes))
        return encode, collective, decode
