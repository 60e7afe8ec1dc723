"""pytest plugin of sanitize.py: writes each test's node id to stderr, unbuffered,
as the test starts and once it has finished, so that a sanitizer's report (or
the crash UBSan ends the process with) can be attributed to the test that was
running, and a run after a crash can leave out the tests already done."""

import os

PROGRESS = "cuda-emulation-sanitize: running "
FINISHED = "cuda-emulation-sanitize: finished "


def pytest_runtest_logstart(nodeid, location):
    del location
    os.write(2, ("\n%s%s\n" % (PROGRESS, nodeid)).encode())


def pytest_runtest_logfinish(nodeid, location):
    del location
    os.write(2, ("\n%s%s\n" % (FINISHED, nodeid)).encode())


FAILED = "cuda-emulation-sanitize: failed "


def pytest_runtest_logreport(report):
    if report.failed:
        os.write(2, ("\n%s%s (%s)\n" % (FAILED, report.nodeid, report.when)).encode())
