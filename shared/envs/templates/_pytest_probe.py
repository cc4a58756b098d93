"""The pytest plugin the `tests_pass` verifier loads into the hidden test run (inside the sandbox).

Copied as source into a private, read-only harness directory and registered by the bootstrap
before pytest starts; it never imports `rollout`. It records, in a marker file outside the work
dir, that each hidden test's body ran to its end (the verifier wraps each hidden test with
`wrap`) and any tampering it sees: pytest's module or attributes or builtins replaced, this
harness's own functions replaced (its `wrap`, swapped by the code under test, which is imported
before the hidden module's last lines call it), a trace or profile function installed, a
function's code swapped, asserts compiled out. It also records each hidden test its `wrap` was
never asked to wrap, and keeps `pytest.approx` from holding vacuously. The verifier then
trusts a JUnit "passed" only when the body's completion was recorded too and nothing tampered.

The code under test runs in this same process, so code written against this exact harness could
still forge these records; what this stops is every generic way to make pytest say "passed".
"""

from __future__ import annotations

import builtins
import functools
import inspect
import json
import os
import sys
import types
from typing import Any

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_HERE, "probe.json"), encoding="utf-8") as _f:
    _CONF = json.load(_f)
_NONCE: str = _CONF["nonce"]
# Opened before any test module (and so any code under test) is imported; line-buffered so a
# record survives an abrupt exit of the process.
_OUT = open(_CONF["markers"], "a", encoding="utf-8", buffering=1)  # noqa: SIM115
_PYTEST = pytest
_snapshot: dict[str, dict[str, int]] = {}
_watching = False
_TRACE = (sys.gettrace(), sys.getprofile())
# The hidden tests the verifier expects to be wrapped, and those this module's `wrap` was asked
# to wrap: a `wrap` replaced by the code under test (imported before the hidden module's last
# lines run) leaves them apart. Read by the hooks through their default arguments, so names
# rebound in this module's namespace change nothing.
_EXPECTED: tuple[str, ...] = tuple(_CONF.get("fids", ()))
# This module as the hidden modules import it (the bootstrap registers it before running it).
_SELF = sys.modules.get(__name__)


def _record(kind: str, what: str, _out: Any = _OUT, _nonce: str = _NONCE) -> None:
    _out.write(f"{_nonce}\t{kind}\t{what}\n")


def _tampered(what: str, _record: Any = _record) -> None:
    _record("tampered", what)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _watching:
        return
    if event in ("sys.settrace", "sys.setprofile"):
        _tampered(f"{event} was called")
    elif event == "object.__setattr__" and len(args) >= 3 and args[1] == "__code__":
        if not _only_made_a_coroutine(args[0], args[2]):
            _tampered("a function's __code__ was replaced")


def _only_made_a_coroutine(func: Any, new: Any) -> bool:
    """True for `types.coroutine`'s own swap (asyncio does it at import): the same code with
    the iterable-coroutine flag added."""
    old = getattr(func, "__code__", None)
    if not isinstance(old, types.CodeType) or not isinstance(new, types.CodeType):
        return False
    return new == old.replace(co_flags=old.co_flags | inspect.CO_ITERABLE_COROUTINE)


def _check(
    where: str,
    _tampered: Any = _tampered,
    _snapshot: dict[str, dict[str, int]] = _snapshot,
    _self: dict[str, Any] = globals(),  # noqa: B008 - bound once, on purpose
    _patched: set[tuple[str, str, int]] = set(),  # noqa: B006 - one set, filled by _patching
) -> None:
    """Record tampering with pytest, builtins, this harness or tracing since the run was
    configured (values a test put in place through pytest's monkeypatch aside)."""
    if sys.modules.get("pytest") is not _PYTEST:
        _tampered(f"sys.modules['pytest'] was replaced ({where})")
    if sys.modules.get(__name__) is not _SELF:
        _tampered(f"sys.modules[{__name__!r}] was replaced ({where})")
    spaces = (("pytest", vars(_PYTEST)), ("builtins", vars(builtins)), ("the harness", _self))
    for name, space in spaces:
        for key, ident in _snapshot.get(name, {}).items():
            now = id(space.get(key, _snapshot))
            if now != ident and (name, key, now) not in _patched:
                _tampered(f"{name}.{key} was changed ({where})")
    if (sys.gettrace(), sys.getprofile()) != _TRACE:
        _tampered(f"a trace or profile function is installed ({where})")


def wrap(
    space: dict[str, Any],
    path: list[str],
    fid: str,
    _wrapped: set[str] = set(),  # noqa: B006 - one set, shared with the session's last hook
) -> None:
    """Replace the test at `path` in a module's namespace by one that records its completion."""
    _wrapped.add(fid)
    owner: Any = None
    target: Any = space
    for part in path:
        owner = target
        target = target.get(part) if isinstance(target, dict) else vars(target).get(part)
        if target is None:
            return  # not there at the end of the module: the verifier reports it did not run
    raw = target.__func__ if isinstance(target, staticmethod | classmethod) else target
    if not callable(raw):
        return

    if inspect.iscoroutinefunction(raw):

        @functools.wraps(raw)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            _check("before " + fid)
            result = await raw(*args, **kwargs)
            _check("after " + fid)
            _record("done", fid)
            return result

        wrapper: Any = awrapper
    else:

        @functools.wraps(raw)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _check("before " + fid)
            result = raw(*args, **kwargs)
            _check("after " + fid)
            _record("done", fid)
            return result

    if isinstance(target, staticmethod | classmethod):
        wrapper = type(target)(wrapper)
    if isinstance(owner, dict):
        owner[path[-1]] = wrapper
    else:
        setattr(owner, path[-1], wrapper)


def asserts_compiled_out(module: str) -> None:
    """Called from a hidden module's end, inside a try whose `assert False` did not raise."""
    _tampered(f"asserts are compiled out in {module}")


def _patching(original: Any, patched: set[tuple[str, str, int]]) -> Any:
    """pytest's `MonkeyPatch.setattr`, noting each pytest or builtins value it puts in place:
    a hidden test's own `monkeypatch.setattr("builtins.input", ...)` is no tampering."""

    def setattr(self: Any, *args: Any, **kwargs: Any) -> Any:
        spaces = (("pytest", vars(_PYTEST)), ("builtins", vars(builtins)))
        before = {(n, k): id(v) for n, space in spaces for k, v in space.items()}
        result = original(self, *args, **kwargs)
        for name, space in spaces:
            for key, value in space.items():
                if before.get((name, key)) != id(value):
                    patched.add((name, key, id(value)))
        return result

    return setattr


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: Any) -> None:
    """Snapshot pytest and builtins, then start watching."""
    global _watching
    _snapshot["pytest"] = {k: id(v) for k, v in vars(_PYTEST).items()}
    _snapshot["builtins"] = {k: id(v) for k, v in vars(builtins).items()}
    _watching = True
    from _pytest.monkeypatch import MonkeyPatch

    MonkeyPatch.setattr = _patching(MonkeyPatch.setattr, _check.__defaults__[-1])  # type: ignore[index]
    # Everything the hidden modules and hooks call (`_watching` alone is rebound, above).
    _snapshot["the harness"] = {
        k: id(v) for k, v in globals().items() if not k.startswith("__") and k != "_watching"
    }


def pytest_sessionfinish(
    session: Any,
    exitstatus: Any,
    _check: Any = _check,
    _record: Any = _record,
    _expected: tuple[str, ...] = _EXPECTED,
    _wrapped: set[str] = wrap.__defaults__[0],  # type: ignore[index] # no module name holds it
) -> None:
    """A last check once every test ran (pluggy passes only the hook's own arguments: the
    defaults keep this module's functions, whatever its namespace holds by now)."""
    _check("at the end of the session")
    # The verifier weighs these: a module that never imported is reported as such first.
    for fid in _expected:
        if fid not in _wrapped:
            _record("unwrapped", fid)
    _record("finished", str(int(exitstatus)))


def _strict_approx() -> None:
    """Make `value == pytest.approx(x)` hold only for a value that is close to x.

    An approx of a number compares an array element by element, so an empty array (close in
    every one of its no elements) matched any number; and an approx of a datetime or timedelta
    asked the value to subtract itself, so an object of the code under test answered its own
    closeness. Neither ever holds now; everything else is pytest's.
    """
    import datetime

    scalar = type(pytest.approx(0.0))
    as_array = getattr(sys.modules.get(scalar.__module__), "_as_numpy_array", None)
    scalar_eq = scalar.__eq__

    def scalar_equals(self: Any, actual: Any) -> bool:
        array = as_array(actual) if as_array is not None else None
        if array is None:
            return scalar_eq(self, actual)
        # Converted once (an object of the code under test could answer twice, differently).
        return array.size > 0 and scalar_eq(self, array)

    scalar.__eq__ = scalar_equals  # type: ignore[method-assign]
    try:
        timed = type(pytest.approx(datetime.timedelta(0), abs=datetime.timedelta(0)))
    except TypeError:  # a pytest without approx of timedeltas
        return
    if timed is scalar:
        return
    timed_eq = timed.__eq__

    def timed_equals(self: Any, actual: Any) -> bool:
        if not isinstance(actual, datetime.datetime | datetime.timedelta):
            return False
        return timed_eq(self, actual)

    timed.__eq__ = timed_equals  # type: ignore[method-assign]


_strict_approx()
sys.addaudithook(_audit)
