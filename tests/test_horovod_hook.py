"""The Horovod hook's version check: refused with advice, or installed with a warning."""

import types
import warnings

import pytest

from tf_mergecomp import horovod_hook


def _factory(name, device_dense, device_sparse, compression, sparse_as_dense, op,
             gradient_predivide_factor, groups, process_set):
    return None


def _module(factory):
    return types.SimpleNamespace(**({horovod_hook.FACTORY_NAME: factory} if factory else {}))


def test_the_written_for_version_passes_quietly():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert horovod_hook.check_horovod(horovod_hook.HOROVOD_VERSION,
                                          _module(_factory)) is _factory


def test_another_version_with_the_same_factory_warns_and_says_what_to_do():
    with pytest.warns(RuntimeWarning, match=r"written for Horovod 0\.28\.1.*0\.29\.0.*make test"):
        assert horovod_hook.check_horovod("0.29.0", _module(_factory)) is _factory


def test_a_missing_factory_is_refused_with_the_version_to_install():
    with pytest.raises(RuntimeError, match=r"Horovod 0\.30\.0.*is gone.*horovod==0\.28\.1"):
        horovod_hook.check_horovod("0.30.0", _module(None))


def test_a_factory_without_the_arguments_read_is_refused_naming_them():
    def changed(name, compression, op):
        return None

    with pytest.raises(RuntimeError, match=r"no longer takes process_set, device_dense"):
        horovod_hook.check_horovod("0.30.0", _module(changed))


def test_the_installed_hook_reports_the_running_horovod_as_supported():
    import horovod
    import horovod.tensorflow as hvd_tf

    import tf_mergecomp  # noqa: F401 (installs the hook)

    assert horovod.__version__ == horovod_hook.HOROVOD_VERSION
    installed = getattr(hvd_tf, horovod_hook.FACTORY_NAME)
    assert hasattr(installed, horovod_hook._INSTALLED_MARK)
    assert horovod_hook.install() is False  # once only
