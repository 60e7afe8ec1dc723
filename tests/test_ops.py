"""Which op library file ``tf_mergecomp.ops`` picks (tests/test_foundation.py loads it)."""

import sysconfig

from tf_mergecomp import ops


def test_this_pythons_build_is_preferred_among_several(monkeypatch, tmp_path):
    monkeypatch.setattr(ops, "_PACKAGE_DIR", str(tmp_path))
    # A build for another Python, named so that it sorts first.
    other = tmp_path / (ops.library_stem() + ".cpython-00-x86_64-linux-gnu.so")
    other.write_bytes(b"")
    assert ops.library_path() == str(other)  # the only build for this TensorFlow: used
    mine = tmp_path / (ops.library_stem() + sysconfig.get_config_var("EXT_SUFFIX"))
    mine.write_bytes(b"")
    assert ops.library_path() == str(mine)
