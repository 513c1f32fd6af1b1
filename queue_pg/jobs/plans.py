"""Worker steps written once for both workers: generators that yield the client calls to make.

A plan is a generator: it yields :class:`ClientCall` objects and gets back each call's result
(or has its exception thrown in), and returns its own result. The threaded worker runs the calls
on a Client, the asyncio worker awaits them on an AsyncClient; what to call, in which order, and
what to do when a call fails is the plan's, and is the same for both (and testable without a
server: tests/unit/test_settle.py answers the calls itself).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["ClientCall", "Outcome", "Plan"]

R = TypeVar("R")


@dataclass(frozen=True)
class ClientCall:
    """``client.<method>(*args, **kwargs)``, to be made by whoever runs the plan."""

    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self, client: Any) -> Any:
        """The call on ``client`` (an awaitable for an AsyncClient)."""
        return getattr(client, self.method)(*self.args, **self.kwargs)


#: A plan that returns R.
Plan = Generator[ClientCall, Any, R]


class Outcome(Generic[R]):
    """The result or the error of the last call, and (once the plan ended) the plan's value."""

    __slots__ = ("error", "result", "value")

    def __init__(self, result: Any = None, error: Exception | None = None) -> None:
        self.result = result
        self.error = error

    def next(self, plan: Plan[R]) -> ClientCall | None:
        """Hand this outcome to ``plan``: its next call, or None when it returned (``value``)."""
        try:
            if self.error is not None:
                return plan.throw(self.error)
            return plan.send(self.result)
        except StopIteration as stop:
            self.value: R = stop.value
            return None

    @classmethod
    def of(cls, call: Callable[[], Any]) -> Outcome[R]:
        """Make a call, keeping its result or error."""
        try:
            return cls(call())
        except Exception as exc:
            return cls(error=exc)

    @classmethod
    async def of_async(cls, call: Callable[[], Awaitable[Any]]) -> Outcome[R]:
        """Await a call, keeping its result or error."""
        try:
            return cls(await call())
        except Exception as exc:
            return cls(error=exc)
