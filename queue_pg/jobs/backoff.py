"""How long a failed message waits before it is delivered again."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass(frozen=True)
class Backoff:
    """Delay before a failed message is delivered again: ``base * factor**(attempt-1)``, at most
    ``cap`` seconds, of which the fraction ``jitter`` is random (0.5: "equal jitter"), so the
    failures of one outage do not all come back at the same moment."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 600.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if not (self.base >= 0 and self.factor >= 1 and self.cap >= 0 and 0 <= self.jitter <= 1):
            raise ValueError(
                f"invalid {self!r}: need base >= 0, factor >= 1, cap >= 0, 0 <= jitter <= 1"
            )

    def delay(self, attempt: int) -> float:
        """The delay after failed attempt number ``attempt`` (the message's receive_count)."""
        exponent = min(max(attempt - 1, 0), 64)
        full = min(self.cap, self.base * self.factor**exponent)
        return full * (1 - self.jitter) + random.uniform(0, full * self.jitter)
