"""Horovod's process sets as MergeComp reads them (tf_mergecomp/hierarchical.py): whether
dynamic process sets are on, the sets Horovod lists, and the errors of the two-level
reduce; the restart between search candidates (tf_mergecomp/search/restart.py) reads
them the same way."""

import pytest

from tf_mergecomp import hierarchical
from tf_mergecomp.search import restart

TWO_BY_TWO = hierarchical.MachineLayout(rank=0, size=4, ranks_per_machine=2, machines=2)


# As Horovod 0.28.1 reads the variable: C's strtol(value, NULL, 10) != 0.
@pytest.mark.parametrize("value, on", [
    (None, False), ("", False), ("0", False), ("00", False), ("-0", False),
    ("false", False), ("False", False), ("true", False), ("yes", False), ("0x1", False),
    ("1", True), ("2", True), ("-1", True), ("+3", True), (" 1", True), ("1x", True),
])
def test_dynamic_process_sets_are_read_as_horovod_reads_them(value, on, monkeypatch):
    if value is None:
        monkeypatch.delenv("HOROVOD_DYNAMIC_PROCESS_SETS", raising=False)
    else:
        monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", value)
    assert hierarchical.dynamic_process_sets() is on


class _FakeHorovod:
    def __init__(self):
        self.calls = []

    def init(self, process_sets=None):
        self.calls.append(("init", None if process_sets is None
                           else [ps.ranks for ps in process_sets]))

    def add_process_set(self, ranks):
        self.calls.append(("add", ranks))


@pytest.mark.parametrize("value, added", [("1", True), ("false", False), ("true", False)])
def test_a_restart_makes_the_sets_again_as_horovod_allows(value, added, monkeypatch):
    # Where Horovod has dynamic process sets off, add_process_set would fail: the sets are
    # registered at init instead.
    sets = {1: [0, 1], 2: [2, 3]}
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", value)
    monkeypatch.setattr(restart, "_process_sets", lambda: sets)
    hvd = _FakeHorovod()
    restart._init_with_process_sets(hvd, sets)
    if added:
        assert hvd.calls == [("init", None), ("add", [0, 1]), ("add", [2, 3])]
    else:
        assert hvd.calls == [("init", [[0, 1], [2, 3]])]


def _listing(monkeypatch, listing):
    from horovod.common import process_sets

    monkeypatch.setattr(process_sets._basics, "_get_process_set_ids_and_ranks", listing)


def test_the_listed_sets_leave_out_the_global_one(monkeypatch):
    _listing(monkeypatch, lambda: {0: [0, 1, 2, 3], 1: [1, 0], 2: [2, 3]})
    assert hierarchical.listed_process_sets() == {1: [0, 1], 2: [2, 3]}
    assert hierarchical._registered_process_sets() == {(0, 1): 1, (2, 3): 2}
    assert restart._process_sets() == {1: [0, 1], 2: [2, 3]}


def test_sets_horovod_does_not_list_are_none_or_to_be_added(monkeypatch):
    def fails():
        raise ValueError("Horovod has not been initialized properly; use hvd.init().")

    _listing(monkeypatch, fails)
    assert hierarchical.listed_process_sets() is None
    assert restart._process_sets() is None
    assert hierarchical._registered_process_sets() == {}
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "true")
    assert not hierarchical.process_sets_available(TWO_BY_TWO)
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "1")
    assert hierarchical.process_sets_available(TWO_BY_TWO)


def test_two_level_errors_name_both_ways_of_asking_for_it(monkeypatch):
    # Reached with hierarchical=True, or hierarchical=None and two-level group codecs.
    asked = r"two-level reduce \(hierarchical=True, or group codecs such as " \
            r"\"efsignsgd/two-level\" with hierarchical=None\)"
    with pytest.raises(ValueError, match=asked + " needs machines with equal numbers"):
        hierarchical.MachineLayout(rank=0, size=3, ranks_per_machine=2, machines=2).check()
    _listing(monkeypatch, lambda: {0: [0, 1, 2, 3]})
    monkeypatch.setenv("HOROVOD_DYNAMIC_PROCESS_SETS", "0")
    with pytest.raises(ValueError, match=asked + " needs Horovod process sets.*"
                                          "HOROVOD_DYNAMIC_PROCESS_SETS=1"):
        hierarchical.process_sets_for(TWO_BY_TWO)
