"""Processes a test starts end with the test, however it ends."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Iterator
from typing import Any


def stop(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, *, group: bool = False,
         timeout: float = 30) -> int:
    """Sends sig (to the process group with group=True), waits up to timeout, then kills it;
    its exit status (negative for a signal)."""
    with contextlib.suppress(ProcessLookupError):
        if group:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        return proc.wait()


@contextlib.contextmanager
def ended(proc: subprocess.Popen[Any], sig: int = signal.SIGTERM, *, group: bool = False,
          timeout: float = 30) -> Iterator[subprocess.Popen[Any]]:
    """proc for the block, then stopped (see stop); read proc.returncode after the block."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            stop(proc, sig, group=group, timeout=timeout)
