"""A fake communicator for tests: W simulated workers in threads, eager mode.

    world = FakeWorld(3)
    results = world.run(lambda rank, comm: codec.reduce(grads[rank], seed, comm, group))

Each rank runs the function in its own thread; allreduce_mean and allgather
block until every rank has contributed (like Horovod's collectives) and give
every rank the same result, summed / concatenated in rank order. The world
also checks that all ranks issue the same collectives with the same keys in
the same order, and records the bytes each rank sent (``sent_bytes[rank]``).
"""

import threading

import tensorflow as tf


class FakeCommunicator:
    def __init__(self, world, rank):
        self._world = world
        self.rank = rank

    @property
    def size(self):
        return self._world.size

    def allreduce_mean(self, tensor, key):
        tensors = self._world.exchange(self.rank, "allreduce", key, tensor)
        return tf.add_n(tensors) / tf.cast(len(tensors), tensor.dtype)

    def allgather(self, tensor, key):
        return tf.concat(self._world.exchange(self.rank, "allgather", key, tensor), axis=0)

    def reducescatter_mean(self, tensor, key):
        """Rank r's part of the average: Horovod's split of the first dimension (the
        first n % size ranks one element more)."""
        averaged = self.allreduce_mean(tensor, ("reducescatter", key))
        return _part(averaged, self.rank, self.size)

    def grouped_allreduce_mean(self, tensors, key):
        return [self.allreduce_mean(t, (key, i)) for i, t in enumerate(tensors)]

    def grouped_reducescatter_mean(self, tensors, key):
        return [self.reducescatter_mean(t, (key, i)) for i, t in enumerate(tensors)]

    def grouped_allgather(self, tensors, key):
        return [self.allgather(t, (key, i)) for i, t in enumerate(tensors)]

    def alltoall(self, tensor, key):
        """Row r of the result: row ``rank`` of rank r's ``tensor`` (one row per rank)."""
        return tf.stack([rows[self.rank]
                         for rows in self._world.exchange(self.rank, "alltoall", key, tensor)])


def _part(tensor, rank, size):
    n = int(tensor.shape[0])
    base, extra = divmod(n, size)
    start = rank * base + min(rank, extra)
    return tensor[start:start + base + (1 if rank < extra else 0)]


class FakeWorld:
    def __init__(self, size, timeout=60.0):
        self.size = size
        self._timeout = timeout
        self._barrier = threading.Barrier(size)
        self._slots = [None] * size
        self.calls = [[] for _ in range(size)]
        self.sent_bytes = [0] * size

    def communicator(self, rank):
        return FakeCommunicator(self, rank)

    def exchange(self, rank, kind, key, tensor):
        self.calls[rank].append((kind, key))
        self.sent_bytes[rank] += int(tf.size(tensor)) * tensor.dtype.size
        self._slots[rank] = (kind, key, tensor)
        self._barrier.wait(self._timeout)
        contributions = list(self._slots)
        self._barrier.wait(self._timeout)
        mismatched = {(c[0], c[1]) for c in contributions}
        if len(mismatched) != 1:
            raise AssertionError("ranks issued different collectives: %s" % sorted(map(str, mismatched)))
        return [c[2] for c in contributions]

    def run(self, fn):
        """Runs fn(rank, communicator) on every rank; returns the results by rank."""
        results = [None] * self.size
        errors = []

        def worker(rank):
            try:
                results[rank] = fn(rank, self.communicator(rank))
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
                self._barrier.abort()

        threads = [threading.Thread(target=worker, args=(r,)) for r in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results
