"""The tests' side of an isolated hidden-test run: the model's modules as proxies.

Installed by the hidden-test bootstrap before pytest starts. Importing one of the model's
modules (a name its files define that neither the standard library nor the installed packages
have) gives a proxy module; every use of it, and of what it returns, is a request to the
model's process, which this process never lets run code here. What comes back is data: builtin
values by value (exact types only) and anything else as a `RemoteObject` handle.

Rules that keep a verdict out of the model's reach:
- A model object compares (==, <, ...) only with other model objects: `handle == 5` is False
  and `handle < 5` a TypeError, so an object whose `__eq__` always says True proves nothing.
- `bool`, `len`, `hash`, `str`, `repr`, `in` must answer with the exact builtin type.
- An exception the model's code raises is rebuilt here from its class (a builtin one, or a
  local stand-in class per model class so `pytest.raises(mod.MyError)` works), args and public
  attributes, with the model's traceback as a note; one that is not an `Exception` (SystemExit,
  KeyboardInterrupt) becomes `CodeUnderTestError`.
- Only callables of the tests (callbacks, fakes for monkeypatch) can be passed to the model's
  code, and the model can only call them.
- A context manager of the model's suppresses only an exception of a class the test passed to
  the call that made it (`with suppress(KeyError):`), and never a failed assert, pytest.fail,
  skip or exit: its `__exit__` cannot hide a test's failure; nor can its code catch one that a
  callable of the tests' raised into it.
"""

from __future__ import annotations

import builtins
import collections
import collections.abc
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import io
import json
import logging
import os
import runpy
import sys
import types
import warnings
import weakref
from typing import Any

try:
    from . import _xproc_confine as confine
    from . import _xproc_wire as wire
except ImportError:  # in the sandbox, loaded by the bootstrap under their own names
    import _xproc_confine as confine  # type: ignore[no-redef]
    import _xproc_wire as wire  # type: ignore[no-redef]

_MAX_NAME = 200


class CodeUnderTestError(Exception):
    """The model's process ended, broke the wire's rules, or raised a non-Exception."""


CodeUnderTestError.__module__ = "rollout"  # as failure reports name it


_PRIVATE = frozenset(("_rid", "_remote", "_count"))
_CAUGHT = (
    "a callable of the tests' raised this into the code under test, which did not let it "
    "through: a failed check is the test's to report"
)
_REFUSED = (
    "the code under test's __exit__ asked to suppress this exception: it may only suppress an "
    "exception of a class the test passed to the call that made the context manager "
    "(`with suppress(KeyError):`), never a failed assert, pytest.fail, skip or exit"
)
# Standard-library modules whose patched attributes the model's process mirrors.
_MIRRORED = frozenset(sys.stdlib_module_names) | {"builtins"}
# Environment variables of the harness, not the test's: never mirrored.
_PRIVATE_ENV = ("ROLLOUT_PEER_FDS", "PYTEST_")
_UNSENT = object()


def _is_remote(value: Any) -> bool:
    return isinstance(value, RemoteObject | RemoteModule) or (
        isinstance(value, type) and "_rollout_handle" in value.__dict__
    )


def _exact(value: Any, kind: type, what: str) -> Any:
    if type(value) is not kind:
        raise TypeError(f"the code under test answered {what} with a {type(value).__name__}")
    return value


class RemoteObject:
    """An object of the model's process; every use is a request to it."""

    __slots__ = ("_rid", "_remote", "_count", "__weakref__")

    def __init__(self, rid: int, remote: Remote) -> None:
        object.__setattr__(self, "_rid", rid)
        object.__setattr__(self, "_remote", remote)
        object.__setattr__(self, "_count", 1)

    def _op(self, name: str, *args: Any) -> Any:
        return self._remote.op(name, self, *args)

    @property  # type: ignore[misc]
    def __doc__(self) -> Any:  # the model's object's docstring, not this class's
        return self._remote.getattr(self, "__doc__")

    @property
    def __annotations__(self) -> Any:  # the model's object's, not this class's
        return self._remote.getattr(self, "__annotations__")

    @property
    def __signature__(self) -> inspect.Signature:
        """The model's object's signature (`inspect.signature` reads it), built here from data."""
        return self._remote.signature(self)

    # -- attributes and calls

    def __getattr__(self, name: str) -> Any:
        if name in _PRIVATE:
            raise AttributeError(name)
        return self._remote.getattr(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._remote.setattr(self, name, value)

    def __delattr__(self, name: str) -> None:
        self._remote.delattr(self, name)

    def __dir__(self) -> list[str]:
        names = self._op("dir")
        return [n for n in names if type(n) is str] if type(names) is list else []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._remote.call(self, args, kwargs)

    # -- what Python asks for, answered with exact types

    def __repr__(self) -> str:
        try:
            return _exact(self._op("repr"), str, "repr()")
        except Exception as exc:  # noqa: BLE001 - a failing repr must not break a report
            return f"<object of the code under test #{self._rid} (repr failed: {exc})>"

    def __str__(self) -> str:
        return _exact(self._op("str"), str, "str()")

    def __format__(self, spec: str) -> str:
        return _exact(self._op("format", spec), str, "format()")

    def __bool__(self) -> bool:
        return _exact(self._op("bool"), bool, "bool()")

    def __len__(self) -> int:
        n = _exact(self._op("len"), int, "len()")
        if n < 0:
            raise ValueError("the code under test answered len() with a negative number")
        return n

    def __hash__(self) -> int:
        return _exact(self._op("hash"), int, "hash()")

    def __int__(self) -> int:
        return _exact(self._op("int"), int, "int()")

    def __index__(self) -> int:
        return _exact(self._op("index"), int, "index()")

    def __float__(self) -> float:
        return _exact(self._op("float"), float, "float()")

    def __complex__(self) -> complex:
        return _exact(self._op("complex"), complex, "complex()")

    def __contains__(self, item: Any) -> bool:
        return _exact(self._op("contains", item), bool, "`in`")

    def __iter__(self) -> Any:
        it = self._op("iter")
        return it if isinstance(it, RemoteObject) else iter(it)

    def __next__(self) -> Any:
        return self._op("next")

    def __reversed__(self) -> Any:
        return self._op("reversed")

    def __getitem__(self, key: Any) -> Any:
        return self._op("getitem", key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._op("setitem", key, value)

    def __delitem__(self, key: Any) -> None:
        self._op("delitem", key)

    def __enter__(self) -> Any:
        return self._op("enter")

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        answer = self._op("exit", _exited(kind), None, None)
        return self._remote.may_suppress(self, kind, exc, answer)

    def __aexit__(self, kind: Any, exc: Any, tb: Any) -> Any:
        return _aexit(self, self._op("aexit", _exited(kind), None, None), kind, exc)

    def __instancecheck__(self, obj: Any) -> bool:
        return _exact(self._op("isinstance", obj), bool, "isinstance()")

    def __subclasscheck__(self, cls: Any) -> bool:
        return _exact(self._op("issubclass", cls), bool, "issubclass()")

    def __round__(self, ndigits: Any = None) -> Any:
        return self._op("round") if ndigits is None else self._op("round", ndigits)

    def __copy__(self) -> Any:
        return self._op("copy")

    def __deepcopy__(self, memo: Any) -> Any:
        return self._op("deepcopy")

    def __reduce_ex__(self, protocol: Any) -> Any:
        # Its bytes, loaded here, would run its code in the tests' process.
        raise TypeError(
            "an object of the code under test cannot be pickled in the tests' process (loading "
            "it here would run the model's code here): copy.copy and copy.deepcopy copy it in "
            "its own process; a pickle round trip belongs in the model's code"
        )

    def __del__(self) -> None:
        try:
            self._remote.dropped(self._rid, self._count)
        except Exception:  # noqa: BLE001, S110 - at interpreter exit there is nothing to tell
            pass


def _exited(kind: Any) -> Any:
    """What `__exit__` is told: the exception itself stays here; its class crosses as the
    nearest class of its own that can (a builtin one, or one of the model's)."""
    if kind is None:
        return None
    for cls in kind.__mro__:
        if wire.builtin_exception(cls.__name__) is cls or "_rollout_handle" in cls.__dict__:
            return cls
    return Exception


def _unswallowable(exc: Any, kind: Any) -> bool:
    """A failed check of the tests' (an assert, pytest.fail, skip, xfail, exit), a harness
    error or a group holding one is theirs to report: no `__exit__` of the model's hides it."""
    if not issubclass(kind, Exception) or issubclass(kind, AssertionError | CodeUnderTestError):
        return True
    inner = getattr(exc, "exceptions", None) if isinstance(exc, BaseExceptionGroup) else None
    return any(_unswallowable(e, type(e)) for e in inner or ())


def _named_exceptions(values: Any) -> tuple[type[BaseException], ...]:
    """The exception classes among a call's arguments (or in a short tuple of them, as
    `except` takes them): what a test tells a context manager to suppress (`suppress(KeyError)`,
    `ignoring((KeyError, IndexError))`)."""
    found: list[type[BaseException]] = []
    for value in values:
        # Only short tuples: a call with a long list of data costs no scan.
        items = value if type(value) is tuple and len(value) <= 32 else (value,)
        for item in items:
            if isinstance(item, type) and issubclass(item, BaseException) and item not in found:
                found.append(item)
    return tuple(found)


async def _aexit(target: RemoteObject, pending: Any, kind: Any, exc: Any) -> bool:
    answer = await pending
    return target._remote.may_suppress(target, kind, exc, answer)


def _comparison(name: str) -> Any:
    def compare(self: RemoteObject, other: Any) -> Any:
        # Only with the model's own objects: a value of the tests' is never equal to (or
        # ordered against) one of the model's, whatever its methods would say.
        if not _is_remote(other):
            return NotImplemented
        return self._op(name, other)

    compare.__name__ = f"__{name}__"
    return compare


def _arithmetic(name: str) -> Any:
    def apply(self: RemoteObject, other: Any) -> Any:
        return self._op(name, other)

    apply.__name__ = f"__{name}__"
    return apply


def _unary(name: str) -> Any:
    def apply(self: RemoteObject) -> Any:
        return self._op(name)

    apply.__name__ = f"__{name}__"
    return apply


for _one in ("neg", "pos", "abs", "invert", "aiter", "anext", "aenter"):
    setattr(RemoteObject, f"__{_one}__", _unary(_one))
for _cmp in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(RemoteObject, f"__{_cmp}__", _comparison(_cmp))
for _arith in "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift".split():
    setattr(RemoteObject, f"__{_arith}__", _arithmetic(_arith))
    setattr(RemoteObject, f"__r{_arith}__", _arithmetic("r" + _arith))


async def _remote_coroutine(target: RemoteObject) -> Any:
    """Await one of the model's coroutines (in its process) from a coroutine of the tests'."""
    return target._remote.await_(target)


_MODULE_DICT = types.ModuleType.__dict__["__dict__"]


def _own(module: types.ModuleType) -> dict[str, Any]:
    """A proxy module's own namespace (the import system's attributes and ours)."""
    return _MODULE_DICT.__get__(module)


class RemoteNamespace(collections.abc.Mapping):
    """What `module.__dict__` reads as for a proxy module: its own entries, then the model's.

    pytest's monkeypatch (and mock.patch) take the value to restore from `target.__dict__`: a
    plain module dict would hold none of the model's names, and undoing a patch would delete
    the model's function for every later test.
    """

    def __init__(self, module: RemoteModule) -> None:
        self._module = module

    def __getitem__(self, name: Any) -> Any:
        own = _own(self._module)
        if name in own:
            return own[name]
        if not isinstance(name, str) or (name.startswith("__") and name.endswith("__")):
            raise KeyError(name)
        try:
            return own["__rollout_remote__"].getattr(self._module, name)
        except AttributeError:
            raise KeyError(name) from None

    def __iter__(self) -> Any:
        return iter(dir(self._module))

    def __len__(self) -> int:
        return len(dir(self._module))


class RemoteModule(types.ModuleType):
    """A module of the model's code: attributes are fetched from, and set in, its process."""

    @property  # type: ignore[override]
    def __dict__(self) -> RemoteNamespace:  # noqa: PLE0307
        """The module's names as a read-only view: its own, then the model's."""
        return RemoteNamespace(self)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _own(self)["__rollout_remote__"].getattr(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # The import system's own attributes (__spec__, __path__, ...) stay here.
        if name.startswith("__") and name.endswith("__"):
            object.__setattr__(self, name, value)
        else:
            _own(self)["__rollout_remote__"].setattr(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name.startswith("__") and name.endswith("__"):
            object.__delattr__(self, name)
        else:
            _own(self)["__rollout_remote__"].delattr(self, name)

    def __dir__(self) -> list[str]:
        names = _own(self)["__rollout_remote__"].op("dir", self)
        return [n for n in names if type(n) is str] if type(names) is list else []

    @property
    def __all__(self) -> list[str]:
        """The model's public names, less any the module reading them (a star import's)
        already holds as its own or has as a builtin: `from calc import *` never rebinds the
        tests' `math`, `pytest` or helpers, nor shadows their `len`, `isinstance` or `sorted`,
        with the model's objects."""
        names = _own(self).get("__rollout_all__", [])
        caller = sys._getframe(1)
        held, builtin = caller.f_globals, {*caller.f_builtins, *vars(builtins)}
        shadowing = sorted(n for n in names if n in builtin)
        if shadowing:
            # Said where the test author looks: a test that meant the model's `sum` sees why
            # it got the builtin.
            warnings.warn(
                f"`from {self.__name__} import *` leaves the builtins {', '.join(shadowing)} "
                "as they are: import the model's by name",
                stacklevel=2,
            )
        return [
            n
            for n in names
            if n.isidentifier() and n not in builtin and (n not in held or _is_remote(held[n]))
        ]


class Remote:
    """The tests' end of the pipe to the model's process."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self.proxies: weakref.WeakValueDictionary[int, RemoteObject] = weakref.WeakValueDictionary()
        self.modules: dict[int, RemoteModule] = {}
        self.classes: dict[int, type[BaseException]] = {}
        self.exports: dict[int, Any] = {}
        self.export_ids: dict[int, int] = {}
        self.raised: dict[int, BaseException] = {}
        self.pending: list[list[int]] = []
        self.watched: dict[tuple[str, str], Any] = {}
        self.sent_attrs: dict[tuple[str, str], Any] = {}
        self.sent_env: dict[str, str] = {}
        self.sent_cwd = ""
        self.tuples: dict[int, type] = {}
        # Per context manager of the model's: the exception classes the test passed to the
        # call that made it, the only ones its __exit__ may suppress.
        self.suppressible: dict[int, tuple[type[BaseException], ...]] = {}
        # Failed checks (assert, pytest.fail, skip) the tests' callables raised into the
        # model's code during the requests in flight.
        self.failed: list[BaseException] = []
        self.warned: list[Any] = []
        self.logged: list[Any] = []
        self.codec = wire.Codec(
            self.export, self.resolve, self.proxy, self.handle_of, self.tuple_class
        )
        self.peer = wire.Peer(rfd, wfd, self.serve, self.show_output, self.attach_drops)
        self.pid = os.getpid()

    # -- handles

    def handle_of(self, value: Any) -> int | None:
        """The model's handle for one of its objects passed back to it."""
        if type(value) is RemoteObject:
            return value._rid
        if isinstance(value, RemoteModule):
            return _own(value)["__rollout_rid__"]
        if isinstance(value, type):
            return value.__dict__.get("_rollout_handle")
        return None

    def proxy(self, rid: int, tree: dict[str, Any]) -> Any:
        """What stands here for the model's object #rid."""
        if "exc" in tree:
            return self.exception_class(rid, tree["exc"])
        if "module" in tree:
            module = self.modules.get(rid)
            if module is None:
                name = tree["module"] if type(tree["module"]) is str else "?"
                module = RemoteModule(name[:_MAX_NAME])
                _own(module)["__rollout_rid__"] = rid
                _own(module)["__rollout_remote__"] = self
                self.modules[rid] = module
            return module
        found = self.proxies.get(rid)
        if found is not None:
            object.__setattr__(found, "_count", found._count + 1)
        else:
            found = RemoteObject(rid, self)
            self.proxies[rid] = found
        if tree.get("coro") is True:
            # A coroutine of the model's: a real one here, so asyncio.run() and `await` take
            # it; awaiting it runs the model's to its end in its own process.
            return _remote_coroutine(found)
        return found

    def exception_class(self, rid: int, info: Any) -> type[BaseException]:
        """A local class standing in for one of the model's exception classes (one per class)."""
        found = self.classes.get(rid)
        if found is not None:
            return found
        if not isinstance(info, dict):
            raise wire.ProtocolError("an exception class is malformed")
        name = info.get("name")
        name = name if type(name) is str and name.isidentifier() else "RemoteException"
        qualname = info.get("qualname") if type(info.get("qualname")) is str else name
        module = info.get("module") if type(info.get("module")) is str else ""
        raw = info.get("bases") if type(info.get("bases")) is list else []
        bases = []
        for tree in raw[:8]:
            base = self.codec.decode(tree)
            if isinstance(base, type) and issubclass(base, Exception) and base not in bases:
                bases.append(base)
        namespace = {
            "__module__": module[:_MAX_NAME],
            "__qualname__": qualname[:_MAX_NAME],
            "_rollout_handle": rid,
        }
        try:
            cls = type(name, tuple(bases or [CodeUnderTestError]), namespace)
        except TypeError:  # bases whose layouts conflict: the first one alone
            cls = type(name, (bases[0],), namespace)
        self.classes[rid] = cls
        return cls

    def tuple_class(self, tree: Any, name: str, fields: list[str]) -> type:
        """A local named-tuple class standing in for one of the model's (one per class): its
        values compare and read like the model's, without any of its code."""
        if not (isinstance(tree, dict) and type(tree.get("$ref")) is int):
            raise wire.ProtocolError("a named tuple's class is not a handle")
        rid = tree["$ref"]
        cls = self.tuples.get(rid)
        if cls is None or list(cls._fields) != fields:
            try:
                cls = collections.namedtuple(name if name.isidentifier() else "Tuple", fields)
            except (ValueError, TypeError) as exc:
                raise wire.ProtocolError(f"a named tuple's fields are malformed ({exc})") from None
            cls._rollout_handle = rid
            self.tuples[rid] = cls
        return cls

    def export(self, value: Any) -> dict[str, Any]:
        """A handle for one of the tests' callables passed to the model's code."""
        if not callable(value) or inspect.ismodule(value):
            raise TypeError(
                f"a {type(value).__name__} cannot be passed to the code under test: only "
                "builtin values, its own objects and callables cross to its process"
            )
        tid = self.export_ids.get(id(value))
        if tid is None:
            tid = len(self.exports) + 1
            self.exports[tid] = value
            self.export_ids[id(value)] = tid
        return {"$ref": tid}

    def resolve(self, tid: int) -> Any:
        """One of the tests' callables the model's code passed back."""
        if tid not in self.exports:
            raise wire.ProtocolError(f"the code under test named a callable #{tid} never sent")
        return self.exports[tid]

    def dropped(self, rid: int, count: int) -> None:
        """Note that the proxy of #rid is gone (sent with the next request)."""
        self.pending.append([rid, count])
        self.suppressible.pop(rid, None)

    def may_suppress(self, target: RemoteObject, kind: Any, exc: Any, answer: Any) -> bool:
        """Whether the exception leaving a `with` block of the model's context manager stops
        there: only when its `__exit__` says so and the test named the exception's class to the
        call that made it (`with suppress(KeyError):`), and never for a failed check.

        Otherwise a context manager wrapping a test's body could hide its every failure: an
        error of the model's own call, a KeyError or TypeError of the test's check on its
        answer, or a check the test wrote as `raise`.
        """
        if kind is None or not answer:
            return False
        named = self.suppressible.get(target._rid, ())
        if isinstance(exc, BaseException):
            allowed = isinstance(exc, named)
        else:
            allowed = isinstance(kind, type) and issubclass(kind, named)
        if allowed and not _unswallowable(exc, kind):
            return True
        if isinstance(exc, BaseException) and _REFUSED not in getattr(exc, "__notes__", ()):
            exc.add_note(_REFUSED)
        return False

    def attach_drops(self, message: dict[str, Any]) -> None:
        """Piggyback the handles dropped since the last request, and what the tests changed
        in their process that the model's code should see, on this request."""
        if "op" not in message:
            return
        if self.pending:
            message["drop"], self.pending = self.pending, []
        ctx = self.context()
        if ctx:
            message["ctx"] = ctx

    def watch(self, module: str, attr: str, original: Any) -> None:
        """Mirror module.attr (a standard-library module's) to the model's process from now."""
        if module.partition(".")[0] in _MIRRORED:
            self.watched.setdefault((module, attr), original)

    def context(self) -> dict[str, Any]:
        """The tests' changes since the last request: environment, cwd, and patched standard
        library attributes (builtins.input, sys.argv, sys.stdin, time.time...), so the model's
        code runs in the world the test set up, as it would in-process."""
        ctx: dict[str, Any] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith(_PRIVATE_ENV)}
        if env != self.sent_env:
            ctx["env"] = self.sent_env = env
        try:
            cwd = os.getcwd()
        except OSError:
            cwd = self.sent_cwd
        if cwd != self.sent_cwd:
            ctx["cwd"] = self.sent_cwd = cwd
        changes = []
        for (module, attr), original in self.watched.items():
            current = getattr(sys.modules.get(module), attr, original)
            key = (module, attr)
            if isinstance(current, io.StringIO):
                # A stdin a test fed: its unread text, as a stream of its own there.
                mark: Any = (id(current), current.tell())
                value: Any = {"stringio": current.getvalue()[current.tell() :]}
            elif current is original:
                mark, value = None, {"restore": True}
            else:
                mark = current
                try:
                    value = {"value": self.codec.encode(current)}
                except (TypeError, ValueError):
                    continue  # cannot cross: the model's process keeps its own
            prev = self.sent_attrs.get(key, _UNSENT)
            if mark is None:
                if prev is _UNSENT or prev is None:
                    continue  # as it was, there too
            elif type(mark) is tuple:
                if type(prev) is tuple and prev == mark:
                    continue
            elif prev is mark:
                continue
            # The mark holds the value, so its identity cannot be reused while it is compared.
            self.sent_attrs[key] = mark
            changes.append([module, attr, value])
        if changes:
            ctx["set"] = changes
        return ctx

    def show_output(self, message: dict[str, Any]) -> None:
        """Write what the model's code printed where this process's output goes, and keep
        what it warned for `issue_warnings`."""
        for key, stream in (("out", sys.stdout), ("err", sys.stderr)):
            text = message.get(key)
            if type(text) is str and text:
                stream.write(text)
        warned = message.get("warn")
        if warned is not None:
            if type(warned) is not list:
                raise wire.ProtocolError("warnings are not a list")
            self.warned += warned
        logged = message.get("log")
        if logged is not None:
            if type(logged) is not list:
                raise wire.ProtocolError("log records are not a list")
            self.logged += logged

    def issue_logs(self) -> None:
        """Log here what the model's code logged in its process, where this process's loggers
        are enabled for it (so `caplog` and its levels see it as in-process)."""
        logged, self.logged = self.logged, []
        for entry in logged:
            if type(entry) is not list or len(entry) != 6:
                raise wire.ProtocolError("a log record is malformed")
            name, level, text, path, line, func = entry
            kinds = (str, int, str, str, int, str)
            if not all(type(v) is k for v, k in zip(entry, kinds, strict=True)):
                raise wire.ProtocolError("a log record is malformed")
            if not 0 <= level <= 100 or len(name) > 200:
                raise wire.ProtocolError("a log record is malformed")
            logger = logging.getLogger(name or None)
            if logger.isEnabledFor(level):
                # A formatted message and no args: nothing of the record is formatted again.
                logger.handle(logging.LogRecord(name, level, path, line, text, None, None, func))

    def issue_warnings(self) -> None:
        """Issue here the warnings the model's code issued in its process (a Warning class
        and text each), so `pytest.warns` and the tests' warning filters see them."""
        warned, self.warned = self.warned, []
        for entry in warned:
            if type(entry) is not list or len(entry) != 4:
                raise wire.ProtocolError("a warning is malformed")
            category = self.codec.decode(entry[0])
            text, filename, lineno = entry[1:]
            if not (isinstance(category, type) and issubclass(category, Warning)):
                raise wire.ProtocolError("a warning's category is not a Warning class")
            if type(text) is not str or type(filename) is not str or type(lineno) is not int:
                raise wire.ProtocolError("a warning is malformed")
            warnings.warn_explicit(text, category, filename, lineno)

    # -- requests

    def request(self, message: dict[str, Any]) -> Any:
        """Send a request and return the decoded value, or raise what the model's code raised."""
        if os.getpid() != self.pid:
            # A child forked from the tests (multiprocessing) holds a copy of the one pipe:
            # its requests and the tests' own would take each other's replies.
            raise CodeUnderTestError(
                "the code under test is reached from the tests' own process only, not from a "
                "process it forked (multiprocessing): call its code in the test itself"
            )
        mark = len(self.failed)
        try:
            reply = self.peer.request(message)
            # After the reply is in: a warning the tests' filters turn into an error is then
            # this call's exception, as it would be in-process.
            self.issue_warnings()
            self.issue_logs()
            error = self.rebuild(reply["x"]) if "x" in reply else None
            # A failed check that a callable of the tests' raised into the model's code leaves
            # this call, whatever that code did with it (caught it, or raised another).
            caught = [e for e in self.failed[mark:] if e is not error]
            if caught:
                if _CAUGHT not in getattr(caught[0], "__notes__", ()):
                    caught[0].add_note(_CAUGHT)
                raise caught[0]
            if error is not None:
                raise error
            return self.codec.decode(reply.get("v"))
        except wire.Gone:
            raise CodeUnderTestError(
                "the code under test's process ended (it exited or was killed)"
            ) from None
        except wire.ProtocolError as exc:
            self.peer.gone = wire.Gone(str(exc))
            raise CodeUnderTestError(f"the code under test broke the protocol: {exc}") from None
        finally:
            del self.failed[mark:]

    def op(self, name: str, target: Any, *args: Any) -> Any:
        """Apply an operator to one of the model's objects, in its process."""
        return self.request(
            {
                "op": "op",
                "name": name,
                "obj": self.codec.encode(target),
                "args": self.codec.encode(list(args)),
            }
        )

    def signature(self, target: Any) -> inspect.Signature:
        """inspect.signature of one of the model's objects, rebuilt from the data it sends."""
        data = self.op("signature", target)
        try:
            if type(data) is not dict or type(data.get("params")) is not list:
                raise TypeError("not a list of parameters")
            params = [self.parameter(entry) for entry in data["params"]]
            back = data.get("return", inspect.Signature.empty)
            return inspect.Signature(params, return_annotation=back)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise CodeUnderTestError(
                f"the code under test sent a malformed signature ({exc})"
            ) from None

    @staticmethod
    def parameter(entry: Any) -> inspect.Parameter:
        """One parameter of a signature, from its data (a name, a kind, a default, a note)."""
        if type(entry) is not dict or type(entry.get("name")) is not str:
            raise TypeError("a parameter is not a named entry")
        kind = entry.get("kind")
        if type(kind) is not int or not 0 <= kind <= 4:
            raise ValueError("a parameter's kind is not one of inspect's")
        return inspect.Parameter(
            entry["name"],
            type(inspect.Parameter.POSITIONAL_ONLY)(kind),
            default=entry.get("default", inspect.Parameter.empty),
            annotation=entry.get("annotation", inspect.Parameter.empty),
        )

    def getattr(self, target: Any, name: str) -> Any:
        """An attribute of one of the model's objects."""
        return self.request({"op": "getattr", "obj": self.codec.encode(target), "name": name})

    def setattr(self, target: Any, name: str, value: Any) -> None:
        """Set an attribute of one of the model's objects."""
        encoded = self.codec.encode(value)
        self.request(
            {"op": "setattr", "obj": self.codec.encode(target), "name": name, "value": encoded}
        )

    def delattr(self, target: Any, name: str) -> None:
        """Delete an attribute of one of the model's objects."""
        self.request({"op": "delattr", "obj": self.codec.encode(target), "name": name})

    def call(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call one of the model's objects."""
        result = self.request(
            {
                "op": "call",
                "obj": self.codec.encode(target),
                "args": self.codec.encode(list(args)),
                "kwargs": self.codec.encode(kwargs),
            }
        )
        if type(result) is RemoteObject:
            named = _named_exceptions([*args, *kwargs.values()])
            if named:
                known = self.suppressible.get(result._rid, ())
                self.suppressible[result._rid] = known + tuple(c for c in named if c not in known)
        return result

    def await_(self, target: Any) -> Any:
        """Await one of the model's awaitables to its end, in its process."""
        return self.request({"op": "await", "obj": self.codec.encode(target), "args": []})

    def import_module(self, name: str) -> dict[str, Any]:
        """Import one of the model's modules in its process."""
        info = self.request({"op": "import", "name": name, "obj": None})
        if not isinstance(info, dict) or not isinstance(info.get("module"), RemoteModule):
            raise CodeUnderTestError(f"the code under test answered the import of {name} oddly")
        return info

    def rebuild(self, tree: Any) -> BaseException:
        """The exception the model's code raised, rebuilt from data."""
        if not isinstance(tree, dict):
            raise wire.ProtocolError("an exception is malformed")
        token = tree.get("token")
        if type(token) is int and token in self.raised:
            return self.raised[token]  # the tests' own exception, out of their callback
        cls = self.codec.decode(tree.get("type"))
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            raise wire.ProtocolError("an exception's class is not an exception class")
        args = self.codec.decode(tree.get("args", {"$t": []}))
        args = args if type(args) is tuple else (args,)
        text = tree.get("text") if type(tree.get("text")) is str else ""
        exc: BaseException
        if not issubclass(cls, Exception):
            exc = CodeUnderTestError(f"the code under test raised {cls.__name__}{args!r}")
        else:
            try:
                exc = cls(*args)
            except Exception:  # noqa: BLE001 - a class whose constructor wants other args
                exc = cls.__new__(cls)
                exc.args = args
            attrs = tree.get("attrs")
            for key, value in attrs.items() if isinstance(attrs, dict) else []:
                if type(key) is str and key.isidentifier() and not key.startswith("_"):
                    try:
                        setattr(exc, key, self.codec.decode(value))
                    except (AttributeError, TypeError):
                        continue
        if text:
            exc.add_note("raised in the code under test (its own process):\n" + text[:8_000])
        return exc

    def serve(self, message: dict[str, Any]) -> dict[str, Any]:
        """Answer the model's call of one of the tests' callables."""
        if message.get("op") != "call":
            raise wire.ProtocolError("the code under test may only call the tests' callables")
        target = self.codec.decode(message.get("obj"))
        if not any(target is v for v in self.exports.values()):
            raise wire.ProtocolError("the code under test called something it was not given")
        args = self.codec.decode(message.get("args", []))
        kwargs = self.codec.decode(message.get("kwargs", {"$d": []}))
        if type(args) is not list or type(kwargs) is not dict:
            raise wire.ProtocolError("a callback's arguments are malformed")
        if not all(type(k) is str for k in kwargs):
            raise wire.ProtocolError("a callback's keyword names are not strings")
        try:
            return {"v": self.codec.encode(target(*args, **kwargs))}
        except BaseException as exc:  # noqa: BLE001 - pytest.fail inside a callback included
            token = len(self.raised) + 1
            self.raised[token] = exc
            if _unswallowable(exc, type(exc)):
                self.failed.append(exc)
            return {
                "x": {
                    "name": type(exc).__name__,
                    "message": str(exc)[:10_000],
                    "token": token,
                }
            }


class RemoteFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the model's modules (by top-level name) and loads them as proxies."""

    def __init__(self, remote: Remote, names: set[str]) -> None:
        self.remote = remote
        self.names = names

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        """A spec for the model's modules; None for anything else."""
        if fullname.partition(".")[0] not in self.names:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, origin="the code under test")

    def create_module(self, spec: Any) -> RemoteModule:
        """Import the module in the model's process and stand a proxy in for it."""
        # A spec made from one of the model's files by path names its module in loader_state.
        info = self.remote.import_module(spec.loader_state or spec.name)
        module: RemoteModule = info["module"]
        if info.get("package"):
            spec.submodule_search_locations = []
        if type(info.get("file")) is str:
            module.__file__ = info["file"]
        names = info.get("all")
        names = [n for n in names if type(n) is str] if type(names) is list else []
        _own(module)["__rollout_all__"] = names
        return module

    def exec_module(self, module: Any) -> None:
        """Nothing to run here: the module ran in the model's process."""


class _Barred(importlib.abc.PathEntryFinder):
    """A sys.path entry inside a directory the model's process writes: nothing loads from it."""

    def find_spec(self, fullname: str, target: Any = None) -> None:
        """Nothing there is this process's to import."""
        return None

    def invalidate_caches(self) -> None:
        """Nothing is cached."""


def bar_model_files(finder: RemoteFinder, workdir: str, scratch: str) -> None:
    """Keep every file the model's process can write out of this process's code.

    A test may put the work dir (or tmp_path) on sys.path, or load the model's file by its
    path: either would run code of the model's here, next to the harness, and a file named as
    a module imported later (`csv.py`) would not even be the model's module. Its modules still
    come as proxies, by name or, through `spec_from_file_location`, by path; no other file
    there is imported, loaded or run.
    """
    roots = tuple(os.path.realpath(p) for p in (workdir, scratch) if p)

    def inside(path: Any) -> bool:
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return any(real == root or real.startswith(root + os.sep) for root in roots)

    def refuse(path: Any) -> ImportError:
        return ImportError(
            f"{os.fsdecode(path)} is a file of the code under test: the tests' process does not "
            "load or run it (import the model's modules by name; run a script in a subprocess)"
        )

    def path_hook(entry: str) -> importlib.abc.PathEntryFinder:
        if inside(entry or "."):
            return _Barred()
        raise ImportError("not a directory of the code under test")  # the next hook's

    sys.path_hooks.insert(0, path_hook)
    sys.path_importer_cache.clear()

    file_loader = importlib.machinery.SourceFileLoader.__mro__[1]  # FileLoader: .py and .pyc
    get_data = file_loader.get_data

    def guarded_get_data(self: Any, path: Any) -> bytes:
        if inside(path):
            raise refuse(path)
        return get_data(self, path)

    file_loader.get_data = guarded_get_data

    from_file = importlib.util.spec_from_file_location

    def spec_from_file_location(name: str, location: Any = None, *args: Any, **kw: Any) -> Any:
        if location is None or not inside(location):
            return from_file(name, location, *args, **kw)
        rel = os.path.relpath(os.path.realpath(os.fsdecode(location)), roots[0])
        parts = rel.split(os.sep)
        package = parts[-1] == "__init__.py"
        parts = parts[:-1] if package else [*parts[:-1], parts[-1].removesuffix(".py")]
        if not (rel.endswith(".py") and parts and parts[0] in finder.names):
            raise refuse(location)
        if not all(p.isidentifier() for p in parts):
            raise refuse(location)
        return importlib.machinery.ModuleSpec(
            name,
            finder,
            origin="the code under test",
            loader_state=".".join(parts),
            is_package=package,
        )

    importlib.util.spec_from_file_location = spec_from_file_location
    run_path = runpy.run_path

    def guarded_run_path(path_name: Any, *args: Any, **kw: Any) -> dict[str, Any]:
        if inside(path_name):
            raise refuse(path_name)
        return run_path(path_name, *args, **kw)

    runpy.run_path = guarded_run_path


def install(config_path: str) -> Remote:
    """Connect to the model's process (the pipe's fds are in ROLLOUT_PEER_FDS), read the
    model's module names from the config and put the finder first on sys.meta_path."""
    with open(config_path, encoding="utf-8") as f:
        conf = json.load(f)
    rfd, wfd = (int(fd) for fd in os.environ["ROLLOUT_PEER_FDS"].split(","))
    # Not inherited by what a test starts: only this process talks to the model's.
    os.set_inheritable(rfd, False)
    os.set_inheritable(wfd, False)
    remote = Remote(rfd, wfd)
    # A name the standard library or an installed package already has is never the model's:
    # pytest and its plugins import those, and must never get a proxy.
    names = {
        n
        for n in conf["names"]
        if isinstance(n, str)
        and n not in sys.stdlib_module_names
        and n not in sys.modules
        and importlib.util.find_spec(n) is None
    }
    finder = RemoteFinder(remote, names)
    sys.meta_path.insert(0, finder)
    bar_model_files(finder, conf.get("workdir", ""), conf.get("scratch", ""))
    confine.confine_children(
        conf.get("workdir", ""), conf.get("scratch", ""), conf.get("private", [])
    )
    # What tests commonly change for the code they call: every builtin, argv and stdin, and
    # any standard-library attribute set through pytest's monkeypatch.
    for name, value in list(vars(builtins).items()):
        remote.watch("builtins", name, value)
    remote.watch("sys", "argv", sys.argv)
    remote.watch("sys", "stdin", sys.stdin)
    from _pytest.monkeypatch import MonkeyPatch

    original = MonkeyPatch.setattr

    def setattr(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = len(self._setattr)
        result = original(self, *args, **kwargs)
        for target, attr, old in self._setattr[before:]:
            if isinstance(target, types.ModuleType) and not isinstance(target, RemoteModule):
                remote.watch(target.__name__, attr, old)
        return result

    MonkeyPatch.setattr = setattr  # type: ignore[method-assign]
    return remote
