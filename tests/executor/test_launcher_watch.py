"""A rank's watch on its launcher (worker._gone): a launcher that exited, reaped or not, is gone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from smplan.executor.worker import _gone


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="zombies are told apart through /proc")
def test_a_live_process_is_not_gone_and_an_exited_one_is_whether_reaped_or_not():
    assert not _gone(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while not _gone(child.pid) and time.monotonic() < deadline:  # exited, not reaped yet: a zombie
        time.sleep(0.05)
    assert _gone(child.pid)
    child.wait()
    assert _gone(child.pid)  # reaped: no /proc entry
