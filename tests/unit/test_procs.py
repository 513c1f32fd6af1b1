"""tests/procs.py: a process a test started ends with the test, even when the test fails."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests.procs import ended

# a process that ignores Ctrl-C, as a hung server would
DEAF = [sys.executable, "-c",
        "import signal, sys, time\n"
        "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)"]


def test_a_failing_block_still_ends_a_process_that_ignores_the_signal() -> None:
    proc = subprocess.Popen(DEAF, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    with pytest.raises(AssertionError, match="the test failed"), ended(proc, signal.SIGINT,
                                                                       timeout=1):
        raise AssertionError("the test failed")
    assert proc.returncode == -signal.SIGKILL


def test_a_process_that_stops_on_the_signal_reports_its_status() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    with ended(proc, signal.SIGTERM, timeout=30):
        pass
    assert proc.returncode == -signal.SIGTERM
