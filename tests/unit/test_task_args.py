"""A task's argument check: the quick test by names agrees with ``Signature.bind`` on every
call shape, and what it cannot decide goes to ``bind`` (which words the error)."""

from __future__ import annotations

import inspect
import itertools
from typing import Any

import pytest

from queue_pg.jobs.tasks import Registry, Task, _quick_fit


def f0() -> None: ...
def f1(a: Any) -> None: ...
def f2(a: Any, b: Any = 1) -> None: ...
def f3(a: Any, *, k: Any) -> None: ...
def f4(a: Any = 0, *, k: Any = 1, m: Any = 2) -> None: ...
def f5(job: Any, a: Any, b: Any = 1) -> None: ...
def v1(*args: Any) -> None: ...
def v2(a: Any, **kwargs: Any) -> None: ...
def v3(a: Any, /, b: Any) -> None: ...
def v4(*, job: Any) -> None: ...


SHAPES: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    (args, dict.fromkeys(keys, 0))
    for n in range(4)
    for args in [tuple(range(n))]
    for r in range(3)
    for keys in itertools.combinations(["a", "b", "k", "m", "job", "zz"], r)
]


def _binds(fn: Any, skip: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    try:
        inspect.signature(fn).bind(*([None] * skip), *args, **kwargs)
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("fn", [f0, f1, f2, f3, f4, f5])
@pytest.mark.parametrize("skip", [0, 1])
def test_the_quick_test_agrees_with_bind_on_every_shape(fn: Any, skip: int) -> None:
    fits = _quick_fit(inspect.signature(fn), skip)
    if skip > len(inspect.signature(fn).parameters):
        assert fits is None
        return
    assert fits is not None
    for args, kwargs in SHAPES:
        assert fits(args, kwargs) is _binds(fn, skip, args, kwargs), (fn.__name__, args, kwargs)


@pytest.mark.parametrize("fn, skip", [(v1, 0), (v2, 0), (v3, 0), (v4, 1), (v1, 1)])
def test_other_signatures_are_left_to_bind(fn: Any, skip: int) -> None:
    assert _quick_fit(inspect.signature(fn), skip) is None


@pytest.mark.parametrize("bind", [False, True])
def test_check_args_raises_what_bind_raises(bind: bool) -> None:
    task = Task(f5 if bind else f2, queue="q", name="t", bind=bind, registry=Registry())
    task.check_args([1], {"b": 2})
    with pytest.raises(TypeError, match=r"multiple values|unexpected|missing"):
        task.check_args([1], {"a": 2})
    with pytest.raises(TypeError, match="unexpected keyword"):
        task.check_args([1], {"zz": 2})
    with pytest.raises(TypeError, match="missing"):
        task.check_args([], {})
