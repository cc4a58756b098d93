"""The wire between the hidden tests' process and the process running the model's code.

`tests_pass` runs the hidden tests in one sandbox and the model's code in another; a test that
imports the model's module gets a proxy whose every use is a request over a pipe. This module is
both sides' half of that pipe: length-prefixed JSON frames, a codec that sends builtin values by
value and everything else as a handle, and a `Peer` that sends a request and serves the other
side's requests (a callback into the tests) while it waits for the reply.

It is copied as source into each sandbox and never imports `rollout`. The tests' side must treat
every frame as hostile (the model's code controls the other process entirely): `decode` accepts
only the tags below, bounded in size and depth, and raises `ProtocolError` on anything else.
"""

from __future__ import annotations

import base64
import collections
import datetime
import decimal
import fractions
import json
import math
import os
import pathlib
import struct
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

MAX_FRAME = 64 * 1024 * 1024
MAX_DEPTH = 200
MAX_HEX_DIGITS = 1_000_000
MAX_OUTPUT = 1_000_000
# JSON numbers stay exact up to here on any reader; larger ints travel as hex.
_JSON_INT = 2**53
_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """The other process broke the wire's rules (or went away); nothing it sent is trusted."""


class Gone(ProtocolError):
    """The other process's end of the pipe closed: it exited or was killed."""


# ---------------------------------------------------------------- frames


def write_frame(fd: int, message: dict[str, Any]) -> None:
    """Send one message as a length-prefixed JSON frame."""
    data = json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"a message of {len(data)} bytes is over the {MAX_FRAME} limit")
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        try:
            sent = os.write(fd, view)
        except BrokenPipeError:
            raise Gone("the other process is gone") from None
        view = view[sent:]


def _read_exact(fd: int, n: int) -> bytes:
    chunks: list[bytes] = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise Gone("the other process is gone")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def read_frame(fd: int) -> dict[str, Any]:
    """Receive one message; ProtocolError when it is oversized, not JSON, or not an object."""
    (size,) = _HEADER.unpack(_read_exact(fd, _HEADER.size))
    if size > MAX_FRAME:
        raise ProtocolError(f"a message of {size} bytes is over the {MAX_FRAME} limit")
    try:
        message = json.loads(_read_exact(fd, size).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"a message is not valid JSON ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise ProtocolError("a message is not a JSON object")
    return message


# ---------------------------------------------------------------- values

# Exact types only: a subclass (an int whose __eq__ always says True) is not a plain value and
# travels as a handle, which compares with nothing of the tests' own.
_SCALARS = (type(None), bool, str)
_BUILTINS = __builtins__ if isinstance(__builtins__, dict) else vars(__builtins__)


def builtin_exception(name: Any) -> type[BaseException] | None:
    """The builtin exception class called `name`, or None."""
    value = _BUILTINS.get(name) if isinstance(name, str) else None
    return value if isinstance(value, type) and issubclass(value, BaseException) else None


def builtin_type(name: Any) -> type | None:
    """The builtin (non-exception) type called `name`, or None."""
    value = _BUILTINS.get(name) if isinstance(name, str) else None
    if isinstance(value, type) and not issubclass(value, BaseException):
        return value
    return None


class Codec:
    """Turns values into JSON-able trees and back; objects travel as handles to an export table.

    `export(obj)` gives the handle this side sends for an object it keeps; `resolve_own(id)` the
    object behind a handle this side sent earlier; `proxy(id, extra)` what this side holds for a
    handle the other side sent; `tuple_class(tree, name, fields)` the class a named tuple is
    rebuilt with (a local stand-in on the tests' side, the real class on the model's).
    """

    def __init__(
        self,
        export: Callable[[Any], dict[str, Any]],
        resolve_own: Callable[[int], Any],
        proxy: Callable[[int, dict[str, Any]], Any],
        own_handle: Callable[[Any], int | None],
        tuple_class: Callable[[Any, str, list[str]], Any],
    ) -> None:
        self.export = export
        self.resolve_own = resolve_own
        self.proxy = proxy
        self.own_handle = own_handle
        self.tuple_class = tuple_class

    # -- encode (anything this side holds)

    def encode(self, value: Any, depth: int = 0, stack: set[int] | None = None) -> Any:
        """A JSON-able tree for value."""
        if depth > MAX_DEPTH:
            raise ValueError("the value is nested too deeply to send")
        kind = type(value)
        if kind in _SCALARS:
            return value
        if kind is int:
            return value if -_JSON_INT < value < _JSON_INT else {"$i": hex(value)}
        if kind is float:
            return value if math.isfinite(value) else {"$f": repr(value)}
        handle = self.own_handle(value)
        if handle is not None:
            return {"$own": handle}
        stack = set() if stack is None else stack
        if kind in (list, tuple, set, frozenset, dict):
            if id(value) in stack:  # a cycle: the inner occurrence goes as a handle
                return self.export(value)
            stack.add(id(value))
            try:
                if kind is dict:
                    pairs = [
                        [self.encode(k, depth + 1, stack), self.encode(v, depth + 1, stack)]
                        for k, v in value.items()
                    ]
                    return {"$d": pairs}
                items = [self.encode(v, depth + 1, stack) for v in value]
                tag = {list: None, tuple: "$t", set: "$s", frozenset: "$fs"}[kind]
                return items if tag is None else {tag: items}
            finally:
                stack.discard(id(value))
        structured = self._encode_structured(value, kind, depth, stack)
        if structured is not None:
            return structured
        simple = _encode_simple(value, kind)
        if simple is not None:
            return simple
        return self.export(value)

    def _encode_structured(self, value: Any, kind: type, depth: int, stack: set[int]) -> Any:
        """The standard library's containers, named tuples and numpy values, by value."""

        def items(values: Any) -> list[Any]:
            return [self.encode(v, depth + 1, stack) for v in values]

        def pairs(mapping: Any) -> list[Any]:
            return [items(pair) for pair in mapping.items()]

        if kind is collections.OrderedDict:
            return {"$od": pairs(value)}
        if kind is collections.Counter:
            return {"$ctr": pairs(value)}
        if kind is collections.defaultdict:
            return {"$dd": [self.encode(value.default_factory, depth + 1, stack), pairs(value)]}
        if kind is collections.deque:
            return {"$dq": [items(value), value.maxlen]}
        fields = getattr(kind, "_fields", None)
        if issubclass(kind, tuple) and isinstance(fields, tuple):
            if all(isinstance(f, str) for f in fields) and len(fields) == len(value):
                cls = self.own_handle(kind)
                cls_tree = {"$own": cls} if cls is not None else self.export(kind)
                return {"$nt": [cls_tree, kind.__name__, list(fields), items(value)]}
        if kind.__module__ == "numpy":
            return _encode_numpy(value)
        return None

    # -- decode (what the other side sent: hostile on the tests' side)

    def decode(self, tree: Any, depth: int = 0) -> Any:
        """The value a tree stands for; ProtocolError on anything malformed."""
        if depth > MAX_DEPTH:
            raise ProtocolError("a value is nested too deeply")
        kind = type(tree)
        if kind in _SCALARS or kind is float:
            return tree
        if kind is int:
            if not -_JSON_INT < tree < _JSON_INT:
                raise ProtocolError("an integer is outside the exact JSON range")
            return tree
        if kind is list:
            return [self.decode(v, depth + 1) for v in tree]
        if kind is not dict or len(tree) == 0:
            raise ProtocolError(f"a value of JSON type {kind.__name__} is not allowed here")
        tag = next(iter(tree))
        body = tree[tag]
        try:
            return self._decode_tagged(tag, body, tree, depth)
        except ProtocolError:
            raise
        except (ValueError, TypeError, OverflowError, KeyError, decimal.InvalidOperation) as exc:
            raise ProtocolError(f"a {tag!r} value is malformed ({exc})") from None

    def _decode_tagged(self, tag: str, body: Any, tree: dict[str, Any], depth: int) -> Any:
        if tag == "$ref":
            if type(body) is not int:
                raise ProtocolError("a handle is not an integer")
            return self.proxy(body, tree)
        if tag == "$own":
            if type(body) is not int:
                raise ProtocolError("a handle is not an integer")
            return self.resolve_own(body)
        if len(tree) != 1:
            raise ProtocolError(f"a {tag!r} value has extra keys")
        if tag in ("$t", "$s", "$fs"):
            items = self._list(body, depth)
            out = {"$t": tuple, "$s": set, "$fs": frozenset}[tag](items)
            return out
        if tag == "$d":
            if type(body) is not list:
                raise ProtocolError("a dict is not a list of pairs")
            result: dict[Any, Any] = {}
            for pair in body:
                if type(pair) is not list or len(pair) != 2:
                    raise ProtocolError("a dict entry is not a pair")
                key = self.decode(pair[0], depth + 1)
                try:
                    result[key] = self.decode(pair[1], depth + 1)
                except TypeError:
                    raise ProtocolError("a dict key is unhashable") from None
            return result
        if tag in ("$od", "$ctr"):
            mapping = {"$od": collections.OrderedDict, "$ctr": collections.Counter}[tag]()
            for key, value in self._pairs(body, depth):
                mapping[key] = value
            return mapping
        if tag == "$dd":
            if type(body) is not list or len(body) != 2:
                raise ProtocolError("a defaultdict is malformed")
            factory = self.decode(body[0], depth + 1)
            if factory is not None and not callable(factory):
                raise ProtocolError("a defaultdict's factory is not callable")
            result = collections.defaultdict(factory)
            for key, value in self._pairs(body[1], depth):
                result[key] = value
            return result
        if tag == "$dq":
            if type(body) is not list or len(body) != 2:
                raise ProtocolError("a deque is malformed")
            if body[1] is not None and (type(body[1]) is not int or body[1] < 0):
                raise ProtocolError("a deque's maxlen is malformed")
            return collections.deque(self._list(body[0], depth), body[1])
        if tag == "$nt":
            if type(body) is not list or len(body) != 4 or type(body[1]) is not str:
                raise ProtocolError("a named tuple is malformed")
            fields = body[2]
            if type(fields) is not list or not all(type(f) is str for f in fields):
                raise ProtocolError("a named tuple's fields are malformed")
            values = self._list(body[3], depth)
            if len(values) != len(fields):
                raise ProtocolError("a named tuple's values do not match its fields")
            cls = self.tuple_class(body[0], body[1], fields)
            return cls._make(values)
        if tag in ("$nd", "$ng"):
            return _decode_numpy(tag, body)
        if tag == "$i":
            if type(body) is not str or len(body) > MAX_HEX_DIGITS:
                raise ProtocolError("a large integer is malformed")
            return int(body, 16)
        if tag == "$f":
            if body not in ("nan", "inf", "-inf"):
                raise ProtocolError("a float tag holds a finite value")
            return float(body)
        return _decode_simple(tag, body)

    def _pairs(self, body: Any, depth: int) -> list[tuple[Any, Any]]:
        if type(body) is not list:
            raise ProtocolError("a mapping is not a list of pairs")
        out = []
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise ProtocolError("a mapping entry is not a pair")
            out.append((self.decode(pair[0], depth + 1), self.decode(pair[1], depth + 1)))
        return out

    def _list(self, body: Any, depth: int) -> list[Any]:
        if type(body) is not list:
            raise ProtocolError("a sequence is not a list")
        return [self.decode(v, depth + 1) for v in body]


def _encode_simple(value: Any, kind: type) -> dict[str, Any] | None:
    """Value types sent by value (their exact type only), or None."""
    if kind is bytes:
        return {"$b": base64.b64encode(value).decode("ascii")}
    if kind is bytearray:
        return {"$ba": base64.b64encode(bytes(value)).decode("ascii")}
    if kind is complex:
        return {"$c": [repr(value.real), repr(value.imag)]}
    if kind is pathlib.PosixPath or kind is pathlib.PurePosixPath:
        return {"$p" if kind is pathlib.PosixPath else "$pp": str(value)}
    if kind is datetime.datetime:
        return {"$dt": value.isoformat()}
    if kind is datetime.date:
        return {"$da": value.isoformat()}
    if kind is datetime.time:
        return {"$tm": value.isoformat()}
    if kind is datetime.timedelta:
        return {"$td": [value.days, value.seconds, value.microseconds]}
    if kind is datetime.timezone:
        return {"$tz": [value.utcoffset(None).total_seconds(), value.tzname(None)]}
    if kind is decimal.Decimal:
        return {"$dec": str(value)}
    if kind is fractions.Fraction:
        return {"$fr": [hex(value.numerator), hex(value.denominator)]}
    if kind is range:
        return {"$r": [value.start, value.stop, value.step]}
    if value is Ellipsis:
        return {"$el": 0}
    if value is NotImplemented:
        return {"$ni": 0}
    if kind is type:
        if builtin_exception(value.__name__) is value:
            return {"$bx": value.__name__}
        if builtin_type(value.__name__) is value:
            return {"$bt": value.__name__}
    return None


# numpy values travel as dtype, shape and raw bytes, for plain dtypes only (no objects, no
# structured fields): the receiving side builds a genuine numpy value from data.
_NUMPY_KINDS = "biufcUSMm"


def _encode_numpy(value: Any) -> dict[str, Any] | None:
    np = sys.modules.get("numpy")
    if np is None:
        return None
    if type(value) is np.ndarray:
        dtype = value.dtype
        if dtype.kind in _NUMPY_KINDS and not dtype.hasobject and dtype.fields is None:
            data = np.ascontiguousarray(value).tobytes()
            return {"$nd": [dtype.str, list(value.shape), base64.b64encode(data).decode()]}
    elif isinstance(value, np.generic) and type(value) is type(np.asarray(value)[()]):
        dtype = np.asarray(value).dtype
        if dtype.kind in _NUMPY_KINDS and not dtype.hasobject and dtype.fields is None:
            data = np.asarray(value).tobytes()
            return {"$ng": [dtype.str, base64.b64encode(data).decode()]}
    return None


def _decode_numpy(tag: str, body: Any) -> Any:
    try:
        import numpy as np
    except ImportError:
        raise ProtocolError("a numpy value, and numpy is not installed here") from None
    if type(body) is not list or len(body) != (3 if tag == "$nd" else 2):
        raise ProtocolError("a numpy value is malformed")
    dtype = np.dtype(_text(body[0], 64))
    if dtype.kind not in _NUMPY_KINDS or dtype.hasobject or dtype.fields is not None:
        raise ProtocolError(f"numpy dtype {dtype} is not sent by value")
    data = base64.b64decode(_text(body[-1], MAX_FRAME), validate=True)
    if tag == "$ng":
        if len(data) != dtype.itemsize:
            raise ProtocolError("a numpy scalar's bytes do not match its dtype")
        return np.frombuffer(data, dtype=dtype)[0]
    shape = body[1]
    if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape):
        raise ProtocolError("a numpy array's shape is malformed")
    if math.prod(shape) * dtype.itemsize != len(data) or len(shape) > 32:
        raise ProtocolError("a numpy array's bytes do not match its shape")
    return np.frombuffer(data, dtype=dtype).reshape(shape).copy()


def _text(body: Any, limit: int = 10_000) -> str:
    if type(body) is not str or len(body) > limit:
        raise ProtocolError("a text field is malformed")
    return body


def _decode_simple(tag: str, body: Any) -> Any:
    if tag == "$b":
        return base64.b64decode(_text(body, MAX_FRAME), validate=True)
    if tag == "$ba":
        return bytearray(base64.b64decode(_text(body, MAX_FRAME), validate=True))
    if tag == "$c":
        if type(body) is not list or len(body) != 2:
            raise ProtocolError("a complex is malformed")
        return complex(float(_text(body[0], 64)), float(_text(body[1], 64)))
    if tag == "$p":
        return pathlib.Path(_text(body, 4096))
    if tag == "$pp":
        return pathlib.PurePosixPath(_text(body, 4096))
    if tag == "$dt":
        return datetime.datetime.fromisoformat(_text(body, 64))
    if tag == "$da":
        return datetime.date.fromisoformat(_text(body, 64))
    if tag == "$tm":
        return datetime.time.fromisoformat(_text(body, 64))
    if tag == "$td":
        if type(body) is not list or len(body) != 3 or any(type(x) is not int for x in body):
            raise ProtocolError("a timedelta is malformed")
        return datetime.timedelta(days=body[0], seconds=body[1], microseconds=body[2])
    if tag == "$tz":
        if type(body) is not list or len(body) != 2 or type(body[0]) not in (int, float):
            raise ProtocolError("a timezone is malformed")
        return datetime.timezone(datetime.timedelta(seconds=body[0]), _text(body[1], 64))
    if tag == "$dec":
        return decimal.Decimal(_text(body, 10_000))
    if tag == "$fr":
        if type(body) is not list or len(body) != 2:
            raise ProtocolError("a fraction is malformed")
        return fractions.Fraction(int(_text(body[0]), 16), int(_text(body[1]), 16))
    if tag == "$r":
        if type(body) is not list or len(body) != 3 or any(type(x) is not int for x in body):
            raise ProtocolError("a range is malformed")
        return range(*body)
    if tag == "$el":
        return Ellipsis
    if tag == "$ni":
        return NotImplemented
    if tag == "$bx":
        cls = builtin_exception(body)
        if cls is None:
            raise ProtocolError(f"{body!r} is not a builtin exception")
        return cls
    if tag == "$bt":
        cls = builtin_type(body)
        if cls is None:
            raise ProtocolError(f"{body!r} is not a builtin type")
        return cls
    raise ProtocolError(f"unknown value tag {tag!r}")


def format_exception(exc: BaseException, limit: int = 8_000) -> str:
    """The traceback text of exc, capped (sent to the tests for their failure reports)."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) <= limit else text[: limit // 2] + "\n...\n" + text[-limit // 2 :]


# ---------------------------------------------------------------- peer


class Peer:
    """One side of the pipe: sends requests and serves the other side's while it waits.

    Requests carry an `id`; replies carry `re` and either `v` (the value) or `x` (an exception).
    `handle(message)` serves one request and returns the reply's fields. `on_message` sees every
    incoming message first (the tests' side writes the output the model's code printed).
    """

    def __init__(
        self,
        rfd: int,
        wfd: int,
        handle: Callable[[dict[str, Any]], dict[str, Any]],
        on_message: Callable[[dict[str, Any]], None] | None = None,
        outgoing: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.rfd, self.wfd = rfd, wfd
        self.handle = handle
        self.on_message = on_message
        self.outgoing = outgoing
        self.next_id = 1
        self.lock = threading.RLock()
        self.gone: Gone | None = None

    def send(self, message: dict[str, Any]) -> None:
        """Write one message (with whatever `outgoing` adds, such as captured output)."""
        if self.outgoing is not None:
            self.outgoing(message)
        write_frame(self.wfd, message)

    def request(self, message: dict[str, Any]) -> dict[str, Any]:
        """Send a request and return its reply, serving nested requests meanwhile."""
        with self.lock:
            if self.gone is not None:
                raise Gone(str(self.gone))
            rid = self.next_id
            self.next_id += 1
            message["id"] = rid
            try:
                self.send(message)
                return self._wait(rid)
            except Gone as exc:
                self.gone = exc
                raise

    def _wait(self, rid: int) -> dict[str, Any]:
        while True:
            message = read_frame(self.rfd)
            if self.on_message is not None:
                self.on_message(message)
            if "re" in message:
                if message["re"] != rid:
                    raise ProtocolError("a reply answers a request that was not asked")
                return message
            self.serve_one(message)

    def serve_one(self, message: dict[str, Any]) -> None:
        """Answer one incoming request."""
        rid = message.get("id")
        if type(rid) is not int:
            raise ProtocolError("a request has no id")
        reply = self.handle(message)
        reply["re"] = rid
        self.send(reply)

    def serve_forever(self) -> None:
        """Serve requests until the other side closes the pipe."""
        while True:
            try:
                message = read_frame(self.rfd)
            except Gone:
                return
            if self.on_message is not None:
                self.on_message(message)
            self.serve_one(message)
