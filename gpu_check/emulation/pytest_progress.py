"""pytest plugin of sanitize.py: writes each test's node id to stderr, unbuffered,
as the test starts, so that a sanitizer's report (or the crash UBSan ends the
process with) can be attributed to the test that was running."""

import os

PROGRESS = "cuda-emulation-sanitize: running "


def pytest_runtest_logstart(nodeid, location):
    del location
    os.write(2, ("\n%s%s\n" % (PROGRESS, nodeid)).encode())
