"""The pytest plugin the `tests_pass` verifier loads into the hidden test run (inside the sandbox).

Copied as source into a private, read-only harness directory and registered by the bootstrap
before pytest starts; it never imports `rollout`. It records, in a marker file outside the work
dir, that each hidden test's body ran to its end (the verifier wraps each hidden test with
`wrap`) and any tampering it sees: pytest's module or attributes or builtins replaced, a trace or
profile function installed, a function's code swapped, asserts compiled out. The verifier then
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


def _record(kind: str, what: str) -> None:
    _OUT.write(f"{_NONCE}\t{kind}\t{what}\n")


def _tampered(what: str) -> None:
    _record("tampered", what)


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _watching:
        return
    if event in ("sys.settrace", "sys.setprofile"):
        _tampered(f"{event} was called")
    elif event == "object.__setattr__" and len(args) >= 2 and args[1] == "__code__":
        _tampered("a function's __code__ was replaced")


def _check(where: str) -> None:
    """Record tampering with pytest, builtins or tracing since the run was configured."""
    if sys.modules.get("pytest") is not _PYTEST:
        _tampered(f"sys.modules['pytest'] was replaced ({where})")
    for name, space in (("pytest", vars(_PYTEST)), ("builtins", vars(builtins))):
        for key, ident in _snapshot.get(name, {}).items():
            if id(space.get(key, _snapshot)) != ident:
                _tampered(f"{name}.{key} was changed ({where})")
    if (sys.gettrace(), sys.getprofile()) != _TRACE:
        _tampered(f"a trace or profile function is installed ({where})")


def wrap(space: dict[str, Any], path: list[str], fid: str) -> None:
    """Replace the test at `path` in a module's namespace by one that records its completion."""
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


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: Any) -> None:
    """Snapshot pytest and builtins, then start watching."""
    global _watching
    _snapshot["pytest"] = {k: id(v) for k, v in vars(_PYTEST).items()}
    _snapshot["builtins"] = {k: id(v) for k, v in vars(builtins).items()}
    _watching = True


def pytest_sessionfinish(session: Any, exitstatus: Any) -> None:
    """A last check once every test ran."""
    _check("at the end of the session")
    _record("finished", str(int(exitstatus)))


sys.addaudithook(_audit)
