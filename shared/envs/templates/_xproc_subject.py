"""The model's side of an isolated hidden-test run: imports its modules and serves the tests.

Runs in a sandbox of its own with the work dir as cwd and nothing of the tests' process in
reach (no tests, no report, no harness, a pid namespace of its own). Every use the tests make of
the model's code arrives as a request (import, getattr, call, an operator); this process runs it
and replies with the result, builtin values by value and anything else as a handle. What it
prints is captured and sent along, so the tests' output (and `capsys`) sees it.

Nothing here is trusted by the tests: the model's code can replace any of it. It exists so that
honest code behaves as it would in-process.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import importlib
import inspect
import io
import logging
import operator
import os
import sys
import threading
import warnings
from typing import Any

try:
    from . import _xproc_wire as wire
except ImportError:  # in the sandbox, loaded by the bootstrap under its own name
    import _xproc_wire as wire  # type: ignore[no-redef]


def signature_data(obj: Any) -> dict[str, Any]:
    """inspect.signature(obj) as data (names, kinds, defaults, annotations): the tests build
    their own Signature from it."""
    sig = inspect.signature(obj)
    params = []
    for param in sig.parameters.values():
        entry: dict[str, Any] = {"name": param.name, "kind": int(param.kind)}
        if param.default is not param.empty:
            entry["default"] = param.default
        if param.annotation is not param.empty:
            entry["annotation"] = param.annotation
        params.append(entry)
    data: dict[str, Any] = {"params": params}
    if sig.return_annotation is not sig.empty:
        data["return"] = sig.return_annotation
    return data


# The operators the tests' proxies forward: name -> how to apply it here (first arg: the handle).
OPERATORS: dict[str, Any] = {
    "signature": signature_data,
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "repr": repr,
    "str": str,
    "format": format,
    "bool": bool,
    "len": len,
    "hash": hash,
    "iter": iter,
    "next": next,
    "reversed": reversed,
    "contains": lambda obj, item: item in obj,
    "getitem": operator.getitem,
    "setitem": operator.setitem,
    "delitem": operator.delitem,
    "int": int,
    "float": float,
    "complex": complex,
    "index": operator.index,
    "neg": operator.neg,
    "pos": operator.pos,
    "abs": abs,
    "invert": operator.invert,
    "round": round,
    "enter": lambda obj: type(obj).__enter__(obj),
    "exit": lambda obj, *args: type(obj).__exit__(obj, *args),
    # The async protocols return the model's awaitable; the tests await it through its handle.
    "aiter": lambda obj: type(obj).__aiter__(obj),
    "anext": lambda obj: type(obj).__anext__(obj),
    "aenter": lambda obj: type(obj).__aenter__(obj),
    "aexit": lambda obj, *args: type(obj).__aexit__(obj, *args),
    "isinstance": lambda cls, obj: isinstance(obj, cls),
    "issubclass": lambda cls, sub: issubclass(sub, cls),
    "dir": lambda obj: sorted(n for n in dir(obj) if isinstance(n, str)),
}
for _name in (
    "eq ne lt le gt ge add sub mul truediv floordiv mod pow matmul and_ or_ xor lshift rshift"
).split():
    OPERATORS[_name.rstrip("_")] = getattr(operator, _name)
for _name in "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift".split():
    # The reflected form: `2 - handle` arrives as ("rsub", handle, 2).
    OPERATORS["r" + _name] = (lambda f: lambda obj, other: f(other, obj))(OPERATORS[_name])


_MISSING = object()
MAX_WARNINGS = 100  # per message: a warning in a loop need not flood the pipe
MAX_RECORDS = 1_000  # log records per message, likewise


class ForwardLogs(logging.Handler):
    """Keeps every log record of the model's code for the tests' process to log again."""

    def __init__(self, server: Server) -> None:
        super().__init__(logging.NOTSET)
        self.server = server

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record as plain data (its message formatted here)."""
        if len(self.server.logged) >= MAX_RECORDS:
            return
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string still leaves its text
            text = str(record.msg)
        self.server.logged.append(
            [
                str(record.name)[:200],
                int(record.levelno),
                text[:10_000],
                str(record.pathname)[:4096],
                int(record.lineno or 0),
                str(record.funcName or "")[:200],
            ]
        )


class CallbackError(Exception):
    """A callback into the tests raised; carries the tests' token for that exception."""


class TestsCallable:
    """A callable of the tests' process passed to the model's code: calling it calls back."""

    __slots__ = ("_tid", "_server")

    def __init__(self, tid: int, server: Server) -> None:
        self._tid = tid
        self._server = server

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the tests' function (only from the thread serving the tests)."""
        return self._server.call_back(self._tid, args, kwargs)

    def __repr__(self) -> str:
        return f"<a callable of the tests #{self._tid}>"


class Server:
    """Serves the tests' requests against the model's code."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self.objects: dict[int, Any] = {}
        self.by_identity: dict[int, int] = {}
        self.sent: dict[int, int] = {}
        self.next_handle = 1
        self.callbacks: dict[int, TestsCallable] = {}
        self.originals: dict[tuple[str, str], Any] = {}
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.get_ident()
        self.stdout = io.StringIO()
        self.stderr = io.StringIO()
        self.warned: list[tuple[Any, str, str, int]] = []
        self.logged: list[list[Any]] = []
        warnings.showwarning = self.keep_warning
        self.codec = wire.Codec(
            self.export, self.resolve, self.callback, self.handle_of, self.tuple_class
        )
        self.peer = wire.Peer(rfd, wfd, self.handle, outgoing=self.attach_output)

    # -- handles

    def export(self, obj: Any) -> dict[str, Any]:
        """The handle sent for obj (one per live object; counted so drops balance)."""
        handle = self.by_identity.get(id(obj))
        if handle is None:
            handle = self.next_handle
            self.next_handle += 1
            self.objects[handle] = obj
            self.by_identity[id(obj)] = handle
        self.sent[handle] = self.sent.get(handle, 0) + 1
        tree: dict[str, Any] = {"$ref": handle}
        if isinstance(obj, type) and issubclass(obj, BaseException):
            tree["exc"] = self.exception_class(obj)
        elif inspect.ismodule(obj):
            tree["module"] = str(obj.__name__)
        elif inspect.isawaitable(obj):
            # Any awaitable (a coroutine, what `anext` returns): the tests get a coroutine of
            # their own for it, and a handle is then never "awaitable" by itself (mock.patch
            # would build an AsyncMock for every function of the model's).
            tree["coro"] = True
        return tree

    def exception_class(self, cls: type[BaseException]) -> dict[str, Any]:
        """What the tests need to stand a local class in for this exception class."""
        bases = [
            self.codec.encode(b)
            for b in cls.__bases__
            if isinstance(b, type) and issubclass(b, BaseException)
        ]
        return {
            "name": str(cls.__name__),
            "qualname": str(getattr(cls, "__qualname__", cls.__name__)),
            "module": str(getattr(cls, "__module__", "")),
            "bases": bases,
        }

    def tuple_class(self, tree: Any, name: str, fields: list[str]) -> Any:
        """The class a named tuple from the tests is rebuilt with: the model's own one, or a
        plain named tuple for one the tests defined."""
        cls = self.codec.decode(tree)
        if isinstance(cls, type) and issubclass(cls, tuple) and hasattr(cls, "_make"):
            return cls
        return collections.namedtuple(name if name.isidentifier() else "Tuple", fields)

    def resolve(self, handle: int) -> Any:
        """The object behind a handle this side sent."""
        if handle not in self.objects:
            raise wire.ProtocolError(f"no object #{handle} here (already dropped?)")
        return self.objects[handle]

    def handle_of(self, value: Any) -> int | None:
        """The tests' id for one of their callables passed back to them."""
        return value._tid if type(value) is TestsCallable else None

    def callback(self, tid: int, tree: dict[str, Any]) -> TestsCallable:
        """What this side holds for a callable the tests passed."""
        found = self.callbacks.get(tid)
        if found is None:
            found = self.callbacks[tid] = TestsCallable(tid, self)
        return found

    def drop(self, drops: Any) -> None:
        """Forget handles the tests no longer hold (each with how many times they received it)."""
        for handle, count in drops if isinstance(drops, list) else []:
            left = self.sent.get(handle, 0) - count
            if left > 0:
                self.sent[handle] = left
                continue
            self.sent.pop(handle, None)
            obj = self.objects.pop(handle, None)
            if obj is not None and self.by_identity.get(id(obj)) == handle:
                del self.by_identity[id(obj)]

    # -- output

    def keep_warning(
        self, message: Any, category: Any, filename: Any, lineno: Any, *_: Any
    ) -> None:
        """Keep a warning the model's code issued, for the tests' process to issue again."""
        if len(self.warned) < MAX_WARNINGS:
            self.warned.append((category, str(message), str(filename), int(lineno or 0)))

    def attach_output(self, message: dict[str, Any]) -> None:
        """Send what the model's code printed (and warned) since the last message with this one."""
        for name, buffer in (("out", self.stdout), ("err", self.stderr)):
            text = buffer.getvalue()
            if text:
                message[name] = text[: wire.MAX_OUTPUT]
                buffer.seek(0)
                buffer.truncate()
        warned, self.warned = self.warned, []
        sent = []
        for category, text, filename, lineno in warned:
            try:
                sent.append([self.codec.encode(category), text[:10_000], filename[:4096], lineno])
            except Exception:  # noqa: BLE001, S112 - a category that cannot travel
                continue
        if sent:
            message["warn"] = sent
        if self.logged:
            message["log"], self.logged = self.logged, []

    # -- requests

    def handle(self, message: dict[str, Any]) -> dict[str, Any]:
        """Serve one request from the tests; any exception becomes the reply's `x`."""
        self.drop(message.get("drop"))
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = self.stdout, self.stderr
        try:
            self.apply(message.get("ctx"))
            value = self.run(message)
            return {"v": self.codec.encode(value)}
        except wire.ProtocolError:
            raise
        except BaseException as exc:  # noqa: BLE001 - everything the model's code raises goes back
            return {"x": self.encode_exception(exc)}
        finally:
            sys.stdout, sys.stderr = saved

    def apply(self, ctx: Any) -> None:
        """Take on what the test changed in its process: environment, cwd, patched attributes."""
        if not isinstance(ctx, dict):
            return
        env = ctx.get("env")
        if isinstance(env, dict):
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in env.items()})
        if isinstance(ctx.get("cwd"), str):
            try:
                os.chdir(ctx["cwd"])
            except OSError:
                pass  # a directory only the tests' sandbox has
        for module, attr, value in ctx.get("set") or []:
            target = sys.modules.get(module)
            if target is None:
                target = importlib.import_module(module)
            key = (module, attr)
            if key not in self.originals:
                self.originals[key] = getattr(target, attr, _MISSING)
            if "restore" in value:
                new = self.originals[key]
            elif "stringio" in value:
                new = io.StringIO(str(value["stringio"]))
            else:
                new = self.codec.decode(value["value"])
            if new is _MISSING:
                if hasattr(target, attr):
                    delattr(target, attr)
            elif module == "sys" and attr in ("stdout", "stderr"):
                continue  # output is captured and sent to the tests already
            else:
                setattr(target, attr, new)

    def run(self, message: dict[str, Any]) -> Any:
        """Do what one request asks."""
        op = message.get("op")
        if op == "import":
            module = importlib.import_module(str(message["name"]))
            names = getattr(module, "__all__", None)
            if not (isinstance(names, list | tuple) and all(isinstance(n, str) for n in names)):
                names = [n for n in vars(module) if isinstance(n, str) and not n.startswith("_")]
            file = getattr(module, "__file__", None)
            return {
                "module": module,
                "package": hasattr(module, "__path__"),
                "file": file if isinstance(file, str) else None,
                "all": list(names),
            }
        target = self.codec.decode(message.get("obj"))
        if op == "getattr":
            return getattr(target, str(message["name"]))
        if op == "setattr":
            setattr(target, str(message["name"]), self.codec.decode(message.get("value")))
            return None
        if op == "delattr":
            delattr(target, str(message["name"]))
            return None
        args = self.codec.decode(message.get("args", []))
        if op == "call":
            kwargs = self.codec.decode(message.get("kwargs", {"$d": []}))
            return target(*args, **kwargs)
        if op == "await":
            return self.await_(target)
        if op == "op":
            fn = OPERATORS.get(str(message.get("name")))
            if fn is None:
                raise TypeError(f"operator {message.get('name')!r} is not forwarded")
            return fn(target, *args)
        raise wire.ProtocolError(f"unknown request {op!r}")

    def await_(self, awaitable: Any) -> Any:
        """Run a coroutine (or any awaitable) of the model's code to its end."""
        if self.loop is None:
            self.loop = asyncio.new_event_loop()

        async def wait() -> Any:
            return await awaitable

        return self.loop.run_until_complete(wait())

    def encode_exception(self, exc: BaseException) -> dict[str, Any]:
        """An exception as the tests rebuild it: its class, args, attributes and traceback."""
        try:
            args = self.codec.encode(tuple(exc.args))
        except Exception:  # noqa: BLE001 - unsendable args: the message still goes
            args = {"$t": [str(exc)]}
        attrs: dict[str, Any] = {}
        for key, value in list(getattr(exc, "__dict__", {}).items())[:50]:
            if isinstance(key, str) and not key.startswith("_"):
                try:
                    attrs[key] = self.codec.encode(value)
                except Exception:  # noqa: BLE001, S112 - an attribute that cannot travel
                    continue
        token = getattr(exc, "_rollout_token", None)
        return {
            "type": self.codec.encode(type(exc)),
            "args": args,
            "attrs": attrs,
            "text": wire.format_exception(exc),
            "token": token if type(token) is int else None,
        }

    def call_back(self, tid: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Call a callable of the tests and return its result (or raise what it raised)."""
        if threading.get_ident() != self.thread:
            raise RuntimeError("a callable of the tests can only be called from the main thread")
        reply = self.peer.request(
            {
                "op": "call",
                "obj": {"$own": tid},
                "args": self.codec.encode(list(args)),
                "kwargs": self.codec.encode(kwargs),
            }
        )
        if "x" in reply:
            raise self.decode_exception(reply["x"])
        return self.codec.decode(reply.get("v"))

    def decode_exception(self, tree: Any) -> BaseException:
        """An exception the tests' callback raised, as this side raises it on."""
        tree = tree if isinstance(tree, dict) else {}
        text = str(tree.get("message", "a callback of the tests raised"))
        cls = wire.builtin_exception(tree.get("name"))
        exc: BaseException
        if cls is not None and issubclass(cls, Exception):
            try:
                exc = cls(text)
            except Exception:  # noqa: BLE001 - an exception class with a fixed signature
                exc = CallbackError(text)
        else:
            exc = CallbackError(text)
        exc._rollout_token = tree.get("token")  # type: ignore[attr-defined]
        return exc


def serve(rfd: int = 0, wfd: int = 1) -> None:
    """Serve the tests over (rfd, wfd) until they close the pipe; print nothing on fd 1."""
    # The pipe moves to private fds, and fd 1 and 2 go to stderr, so nothing the model's code
    # writes to stdout can land in the middle of a frame.
    rfd, wfd = os.dup(rfd), os.dup(wfd)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    os.close(devnull)
    sys.path.insert(0, os.getcwd())
    # Lets the model's code see a main-like process (argv of a plain interpreter).
    sys.argv = [""]
    # Every warning goes to the tests, whose filters decide (pytest.warns, "error" marks), as
    # they would for the code imported into their process.
    warnings.simplefilter("always")
    server = Server(rfd, wfd)
    # Every log record goes to the tests too, where their loggers' levels decide what is kept
    # (caplog sees the model's logging as it would in-process).
    root = logging.getLogger()
    root.setLevel(logging.NOTSET)
    root.addHandler(ForwardLogs(server))
    server.peer.serve_forever()
