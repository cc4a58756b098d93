"""Hidden tests against the model's code in a process of its own (`testIsolation: process`).

The hidden tests import the model's modules as proxies of a second sandbox. Real runs check that
what honest tests commonly do still works through them (objects, exceptions, enums, generators,
callbacks, tmp_path, capsys, monkeypatched env/argv/stdin/builtins/time, packages, coroutines)
and gives the in-process verdict; that a model's object proves nothing by claiming equality;
and, on a bare pipe, that the tests' side takes nothing but data from a hostile model process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest
from waiting import wait_until

from rollout.shared.audit.policies.code_editing import FORGE_HARNESS
from rollout.shared.envs.templates import _xproc_confine, _xproc_tests, _xproc_wire
from rollout.shared.envs.templates.code_editing import run_hidden_tests

MODEL = {
    "shop/__init__.py": "from .cart import Cart, OutOfStock\n__all__ = ['Cart', 'OutOfStock']\n",
    "shop/cart.py": """import enum, os, sys, json, asyncio


class OutOfStock(KeyError):
    def __init__(self, item, left):
        super().__init__(item)
        self.item = item
        self.left = left


class Color(enum.Enum):
    RED = 1
    BLUE = 2


class Cart:
    def __init__(self, stock):
        self.stock = dict(stock)
        self.items = []

    def add(self, item, n=1):
        if self.stock.get(item, 0) < n:
            raise OutOfStock(item, self.stock.get(item, 0))
        self.stock[item] -= n
        self.items.append((item, n))
        return self

    def __len__(self):
        return sum(n for _, n in self.items)

    def __iter__(self):
        for item, n in self.items:
            yield item

    def __contains__(self, item):
        return any(i == item for i, _ in self.items)

    def __eq__(self, other):
        return isinstance(other, Cart) and self.items == other.items

    def __repr__(self):
        return f"Cart({self.items!r})"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.items.clear()
        return False

    def total(self, price):
        return sum(price(item) * n for item, n in self.items)

    def summary(self):
        return {"items": list(self.items), "count": len(self), "tags": {"a", "b"}}


def countdown(n):
    while n:
        yield n
        n -= 1


def save(path, data):
    with open(path, "w") as f:
        json.dump(data, f)


def greet():
    print("hello from the model")
    print("oops", file=sys.stderr)
    return os.environ.get("GREETING", "none")


def cli():
    return sys.argv[1:]


def cli_twice():
    return cli() + cli()


def ask():
    return input("n? ")


def first_line():
    return sys.stdin.readline().strip()


async def fetch(x):
    await asyncio.sleep(0)
    return x * 2


def big():
    return 2 ** 200, float("inf"), b"\\x00\\xff", 3 + 4j


def now_seconds():
    import time
    return time.time()


def audit():
    import logging
    log = logging.getLogger("shop")
    log.info("audited %d items", 3)
    log.warning("low stock")
    return True
""",
    "data.json": '{"k": 1}',
    "stats.py": """import collections

import numpy as np

Point = collections.namedtuple("Point", "x y")


def mean(values):
    return np.mean(values)


def scale(values, k):
    return np.asarray(values, dtype=np.float32) * k


def middle(a, b):
    return Point((a.x + b.x) / 2, (a.y + b.y) / 2)


def tally(words):
    return collections.Counter(words)


def ordered(pairs):
    return collections.OrderedDict(pairs)


def grouped(pairs):
    out = collections.defaultdict(list)
    for k, v in pairs:
        out[k].append(v)
    return out


def window(values, n):
    return collections.deque(values, maxlen=n)
""",
}
TESTS = {
    "test_stats.py": """import collections

import numpy as np

from stats import Point, grouped, mean, middle, ordered, scale, tally, window


def test_numpy_values_cross_as_numpy():
    m = mean([1, 2, 3, 4])
    assert m == 2.5 and isinstance(m, np.floating)
    out = scale([1, 2], 3)
    assert out.dtype == np.float32 and out.tolist() == [3.0, 6.0]
    np.testing.assert_array_equal(out, np.array([3, 6], dtype=np.float32))


def test_named_tuples_and_collections():
    p = middle(Point(0, 0), Point(2, 4))
    assert p == (1.0, 2.0) and p.x == 1.0 and p.y == 2.0
    assert isinstance(p, Point)
    assert tally("a b a".split()) == collections.Counter(a=2, b=1)
    assert type(tally([])) is collections.Counter
    assert list(ordered([("b", 1), ("a", 2)])) == ["b", "a"]
    g = grouped([("x", 1), ("x", 2)])
    assert g == {"x": [1, 2]} and g["missing"] == []
    assert window([1, 2, 3], 2) == collections.deque([2, 3], maxlen=2)
""",
    "test_shop.py": """import asyncio, io, json, logging, os, sys, pathlib

import pytest

import shop
from shop import Cart, OutOfStock
from shop.cart import Color, countdown, save, greet, cli, ask, first_line, fetch, big, now_seconds


def test_objects_and_methods():
    cart = Cart({"apple": 3, "pear": 1})
    assert cart.add("apple", 2) is cart
    assert len(cart) == 2 and "apple" in cart and "kiwi" not in cart
    assert list(cart) == ["apple"]
    assert cart.items == [("apple", 2)]
    assert cart.stock == {"apple": 1, "pear": 1}
    assert cart.summary() == {"items": [("apple", 2)], "count": 2, "tags": {"a", "b"}}
    assert cart.total(lambda item: {"apple": 5}[item]) == 10
    assert repr(cart) == "Cart([('apple', 2)])"
    assert isinstance(cart, Cart) and not isinstance(3, Cart)
    other = Cart({"apple": 3}).add("apple", 2)
    assert cart == other
    with cart as c:
        assert len(c) == 2
    assert len(cart) == 0


def test_exceptions():
    cart = Cart({"apple": 1})
    with pytest.raises(OutOfStock) as info:
        cart.add("apple", 5)
    assert info.value.item == "apple" and info.value.left == 1
    assert isinstance(info.value, KeyError)
    with pytest.raises(KeyError):
        cart.add("kiwi")
    with pytest.raises(AttributeError):
        cart.nothing
    assert not hasattr(cart, "nothing")
    with pytest.raises(ZeroDivisionError):
        cart.total(lambda item: 1 / 0) if cart.add("apple") else None


def test_values_enums_generators():
    assert Color.RED is Color.RED and Color.RED is not Color.BLUE
    assert Color.RED.value == 1 and Color(2) is Color.BLUE
    assert list(countdown(3)) == [3, 2, 1]
    n, inf, raw, z = big()
    assert type(n) is int and n == 2 ** 200 and inf == float("inf")
    assert raw == b"\\x00\\xff" and z == 3 + 4j
    assert shop.__all__ == ["Cart", "OutOfStock"]
    assert pathlib.Path(shop.cart.__file__).name == "cart.py"


def test_files_output_env_argv_stdin(tmp_path, capsys, monkeypatch):
    save(tmp_path / "out.json", {"x": [1, 2]})
    assert json.loads((tmp_path / "out.json").read_text()) == {"x": [1, 2]}
    assert json.load(open("data.json")) == {"k": 1}
    monkeypatch.setenv("GREETING", "hi")
    assert greet() == "hi"
    captured = capsys.readouterr()
    assert "hello from the model" in captured.out and "oops" in captured.err
    monkeypatch.delenv("GREETING")
    assert greet() == "none"
    monkeypatch.setattr(sys, "argv", ["prog", "--flag"])
    assert cli() == ["--flag"]
    monkeypatch.setattr("builtins.input", lambda prompt: "typed")
    assert ask() == "typed"
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\\nsecond\\n"))
    assert first_line() == "first"
    import time
    monkeypatch.setattr(time, "time", lambda: 1234.5)
    assert now_seconds() == 1234.5


def test_after_monkeypatch_undo():
    assert cli() != ["--flag"]
    import time
    assert now_seconds() > 1_000_000


def test_patch_the_models_module(monkeypatch):
    import shop.cart as cart_module
    monkeypatch.setattr(cart_module, "cli", lambda: ["patched"])
    assert cart_module.cli() == ["patched"]


def test_mock_patch_of_a_models_function():
    from unittest import mock
    import shop.cart as cart_module
    with mock.patch("shop.cart.cli") as fake:
        fake.return_value = ["x"]
        assert not isinstance(fake, mock.AsyncMock)
        assert cart_module.cli_twice() == ["x", "x"]
        assert fake.call_count == 2
    # Both patches undone (the monkeypatch above, this one): the model's own function is back,
    # not deleted.
    assert isinstance(cart_module.cli_twice(), list)


def test_logging(caplog):
    from shop.cart import audit
    assert audit() is True
    assert "low stock" in caplog.text and "audited" not in caplog.text
    caplog.clear()
    caplog.set_level(logging.INFO, logger="shop")
    audit()
    assert "audited 3 items" in caplog.text
    assert [r.levelname for r in caplog.records] == ["INFO", "WARNING"]


def test_async():
    assert asyncio.run(fetch(4)) == 8
""",
}


@pytest.mark.parametrize("isolate", [True, False])
async def test_what_honest_tests_do_works_through_the_proxies(isolate: bool) -> None:
    run = await run_hidden_tests(MODEL, TESTS, isolate=isolate)
    assert run.passed, run.reason + "\n" + run.output_tail
    assert len(run.passed_ids) == 11


WARNS = {
    "calc.py": (
        "import warnings\n\n\nclass Legacy(UserWarning):\n    pass\n\n\n"
        "def old_add(a, b):\n    warnings.warn('use add', DeprecationWarning)\n    return a + b\n\n\n"
        "def legacy():\n    warnings.warn('legacy', Legacy)\n"
    )
}
WARNS_TESTS = {
    "test_warns.py": """import pytest

from calc import Legacy, legacy, old_add


def test_deprecated():
    with pytest.warns(DeprecationWarning, match="use add"):
        assert old_add(1, 2) == 3


def test_its_own_category():
    with pytest.warns(Legacy):
        legacy()


@pytest.mark.filterwarnings("error")
def test_an_error_filter():
    with pytest.raises(DeprecationWarning):
        old_add(1, 2)
"""
}


ASYNC = {
    "feed.py": (
        "async def numbers(n):\n    '''Count to n.'''\n    for i in range(n):\n        yield i\n\n\n"
        "class Session:\n    opened = 0\n\n    def __init__(self, *ignored):\n"
        "        self.ignored = ignored\n\n    async def __aenter__(self):\n"
        "        Session.opened += 1\n        return self\n\n"
        "    async def __aexit__(self, kind, exc, tb):\n"
        "        return kind is not None and issubclass(kind, self.ignored)\n"
    )
}
ASYNC_TESTS = {
    "test_feed.py": """import asyncio

import pytest

from feed import Session, numbers


def test_async_for_and_docstrings():
    async def collect():
        return [i async for i in numbers(3)]

    assert asyncio.run(collect()) == [0, 1, 2]
    assert numbers.__doc__ == "Count to n."


def test_async_with():
    async def use():
        async with Session(KeyError) as s:
            raise KeyError("swallowed by its __aexit__")
        async with Session(KeyError):
            assert 1 == 2  # not what it was told to suppress

    with pytest.raises(AssertionError):
        asyncio.run(use())
    assert Session.opened == 2
"""
}


@pytest.mark.parametrize("isolate", [True, False])
async def test_async_iteration_and_context_managers_cross(isolate: bool) -> None:
    run = await run_hidden_tests(ASYNC, ASYNC_TESTS, isolate=isolate)
    assert run.passed, run.reason + "\n" + run.output_tail


# What honest tests read of a function or class: its signature, names, docs and annotations,
# and copies of its objects.
INTROSPECT = {
    "calc.py": '''class Box:
    """A box."""

    def __init__(self, size: int, label="x"):
        self.size = size
        self.items = []

    def grow(self, by: int = 1) -> "Box":
        """Grow it."""
        return Box(self.size + by)

    def push(self, i, x):
        self.items[i].append(x)


def add(a: int, b: int = 2, /, *rest, scale: float = 1.0, **opts) -> int:
    """Add a and b.

    More words.
    """
    return a + b


def box(size, items):
    made = Box(size)
    made.items = items
    return made
'''
}
INTROSPECT_TESTS = {
    "test_introspect.py": """import copy
import functools
import inspect
import pickle

from calc import Box, add, box


def test_signature():
    sig = inspect.signature(add)
    assert list(sig.parameters) == ["a", "b", "rest", "scale", "opts"]
    assert sig.parameters["a"].kind is inspect.Parameter.POSITIONAL_ONLY
    assert sig.parameters["a"].annotation is int
    assert sig.parameters["b"].default == 2
    assert sig.parameters["rest"].kind is inspect.Parameter.VAR_POSITIONAL
    assert sig.parameters["scale"].kind is inspect.Parameter.KEYWORD_ONLY
    assert sig.return_annotation is int
    assert str(sig) == "(a: int, b: int = 2, /, *rest, scale: float = 1.0, **opts) -> int"
    assert sig.bind(1, scale=2.0).arguments == {"a": 1, "scale": 2.0}
    assert str(inspect.signature(Box)) == "(size: int, label='x')"
    assert str(inspect.signature(Box(1).grow)) == "(by: int = 1) -> 'Box'"

    @functools.wraps(add)
    def logged(*args, **kwargs):
        return add(*args, **kwargs)

    assert inspect.signature(logged) == sig
    assert logged.__name__ == "add" and logged(2, 3) == 5


def test_names_docs_and_annotations():
    assert add.__name__ == "add" and add.__qualname__ == "add"
    assert Box.__name__ == "Box" and Box.grow.__qualname__ == "Box.grow"
    assert inspect.getdoc(add) == "Add a and b.\\n\\nMore words."
    assert add.__doc__.startswith("Add a and b.")
    assert inspect.getdoc(Box) == "A box." and inspect.getdoc(Box.grow) == "Grow it."
    assert add.__annotations__ == {"a": int, "b": int, "scale": float, "return": int}
    assert Box.grow.__annotations__ == {"by": int, "return": "Box"}


def test_copies():
    original = box(3, [1, [2]])
    shallow, deep = copy.copy(original), copy.deepcopy(original)
    assert shallow.size == deep.size == 3
    original.push(1, 3)  # its list, in its process (a list read here is a copy)
    assert shallow.items == [1, [2, 3]] and deep.items == [1, [2]]
    shallow.size = 4
    assert original.size == 3
    both = copy.deepcopy({"a": original, "b": original})
    assert both["a"].items == [1, [2, 3]]


def test_a_pickle_round_trip_is_refused_or_works():
    # In-process the object pickles; isolated its bytes never load in the tests' process.
    try:
        again = pickle.loads(pickle.dumps(box(2, [])))
    except TypeError as exc:
        assert "cannot be pickled in the tests' process" in str(exc)
    else:
        assert again.size == 2
"""
}


@pytest.mark.parametrize("isolate", [True, False])
async def test_signatures_docs_and_copies_read_as_the_models(isolate: bool) -> None:
    run = await run_hidden_tests(INTROSPECT, INTROSPECT_TESTS, isolate=isolate)
    assert run.passed, run.reason + "\n" + run.output_tail


@pytest.mark.parametrize("isolate", [True, False])
async def test_the_models_warnings_reach_the_tests(isolate: bool) -> None:
    run = await run_hidden_tests(WARNS, WARNS_TESTS, isolate=isolate)
    assert run.passed, run.reason + "\n" + run.output_tail


async def test_a_bug_behind_the_proxies_fails_with_the_tests_own_message() -> None:
    broken = MODEL["shop/cart.py"].replace("    while n:\n", "    while n > 1:\n")
    run = await run_hidden_tests({**MODEL, "shop/cart.py": broken}, TESTS)
    assert not run.passed
    assert "test_values_enums_generators failed" in run.reason, run.reason
    assert "[3, 2] == [3, 2, 1]" in run.reason, run.reason


async def test_the_models_traceback_reaches_the_failure_report() -> None:
    model = {
        "calc.py": "def add(a, b):\n    return helper(a) + b\n\n\ndef helper(a):\n    raise RuntimeError('deep inside')\n"
    }
    tests = {
        "test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    }
    run = await run_hidden_tests(model, tests)
    assert not run.passed and "RuntimeError: deep inside" in run.reason, run.reason
    assert "raised in the code under test" in run.output_tail
    assert "in helper" in run.output_tail


# Objects that answer "equal" to anything, and an int whose == always says True.
CLAIMS = {
    "calc.py": (
        "class Anything:\n"
        "    def __eq__(self, other):\n        return True\n"
        "    def __hash__(self):\n        return 0\n\n\n"
        "class Liar(int):\n"
        "    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\n\n\n"
        "def add(a, b):\n    return Anything()\n\n\n"
        "def mul(a, b):\n    return Liar(0)\n"
    )
}
NAIVE_TESTS = {
    "test_calc.py": (
        "from calc import add, mul\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n\n\n"
        "def test_add_reversed():\n    assert 5 == add(2, 3)\n\n\n"
        "def test_mul():\n    assert mul(2, 3) == 6\n"
    )
}


async def test_a_value_that_claims_equality_proves_nothing_when_isolated() -> None:
    # The tests check no types: in-process the claims pass; isolated, an object of the model's
    # never equals a value of the tests' (and an int subclass is such an object).
    run = await run_hidden_tests(CLAIMS, NAIVE_TESTS, isolate=False)
    assert run.passed, run.reason
    run = await run_hidden_tests(CLAIMS, NAIVE_TESTS)
    assert not run.passed
    assert "test_add failed" in run.reason and "(and 2 more)" in run.reason, run.reason


async def test_the_models_process_sees_nothing_of_the_tests() -> None:
    # Everything it could look for: other processes, the tests' files, the report's directory.
    model = {
        "spy.py": (
            "import os, sys\n\n\ndef look():\n"
            "    pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
            "    found = []\n"
            # The Python installation is every sandbox's, read-only and public (a checkout's
            # venv may sit under /tmp): not the tests'.
            "    public = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix)}\n"
            "    for root in ('/tmp', os.path.dirname(os.getcwd())):\n"
            "        for dirpath, dirs, files in os.walk(root):\n"
            "            if any(os.path.realpath(dirpath).startswith(p) for p in public):\n"
            "                dirs[:] = []\n"
            "                continue\n"
            "            found += [f for f in files if f.endswith(('.xml', '.json', '.markers'))"
            " or f.startswith('test_')]\n"
            "    return len(pids), sorted(found)\n"
        )
    }
    tests = {
        "test_spy.py": (
            "import os\n\nfrom spy import look\n\n\ndef test_look():\n"
            "    pids, found = look()\n"
            "    assert pids <= 3, pids\n"
            "    assert found == [], found\n"
        )
    }
    run = await run_hidden_tests(model, tests)
    assert run.passed, run.reason + "\n" + run.output_tail


# ---------------------------------------------------------------- real runs of hostile code

BROKEN = {"calc.py": "def add(a, b):\n    return a - b\n"}
FIXED = {"calc.py": "def add(a, b):\n    return a + b\n"}
CHECK = "def check(got, want):\n    assert got == want, (got, want)\n"
NOOP_CHECK = "def check(got, want):\n    pass\n"
USES_CHECK = "from calc import add\n{imp}\n\n\ndef test_add():\n    check(add(2, 3), 5)\n"


@pytest.mark.parametrize(
    ("helper", "imp", "shadow"),
    [
        ("tests/testlib/__init__.py", "from testlib import check", "testlib/__init__.py"),
        ("tests/lib/checks.py", "from lib.checks import check", "lib/checks.py"),
        ("tests/checks.py", "from checks import check", "checks.py"),
    ],
    ids=["a package", "a namespace package's module", "a module"],
)
async def test_a_helper_of_the_hidden_tests_is_never_the_models(
    helper: str, imp: str, shadow: str
) -> None:
    # Hidden tests in a folder import a helper of theirs by its bare name (pytest put the
    # folder on sys.path); the model's module of that name must not stand in for it.
    tests = {helper: CHECK, "tests/test_calc.py": USES_CHECK.format(imp=imp)}
    run = await run_hidden_tests(FIXED, tests)
    assert run.passed, run.reason
    run = await run_hidden_tests({**BROKEN, shadow: NOOP_CHECK}, tests)
    assert not run.passed and "(-1, 5)" in run.reason, run.reason


# Hidden tests that put the work dir on sys.path (so that, in-process, they find the model's
# code) and, in a later module, import a standard module not loaded yet; one loads the model's
# module by its path.
ON_SYS_PATH = {
    "test_calc.py": (
        "import os\nimport sys\n\nsys.path.insert(0, os.getcwd())\n\nfrom calc import add\n\n\n"
        "def test_add():\n    assert add(2, 3) == 5\n"
    ),
    "test_more.py": (
        "import statistics\n\nfrom calc import add\n\n\n"
        "def test_mean():\n    assert add(1, 1) == statistics.mean([2, 2])\n"
    ),
    "test_path.py": (
        "import importlib.util\n\n\ndef test_by_path():\n"
        "    spec = importlib.util.spec_from_file_location('solution', 'calc.py')\n"
        "    solution = importlib.util.module_from_spec(spec)\n"
        "    spec.loader.exec_module(solution)\n"
        "    assert solution.add(2, 3) == 5\n"
    ),
}


async def test_no_file_of_the_model_loads_in_the_tests_process() -> None:
    run = await run_hidden_tests(FIXED, ON_SYS_PATH)
    assert run.passed, run.reason + "\n" + run.output_tail
    # Its forger, named as the standard module and at the top of the module under test:
    # found on sys.path, it would run next to the harness and forge the run.
    forged = {"calc.py": FORGE_HARNESS + BROKEN["calc.py"], "statistics.py": FORGE_HARNESS}
    run = await run_hidden_tests(forged, ON_SYS_PATH)
    assert not run.passed and "assert -1 == 5" in run.reason, run.reason
    # A script run in the tests' process (runpy) is refused: a subprocess runs it instead.
    tests = {"test_run.py": "import runpy\n\n\ndef test_main():\n    runpy.run_path('calc.py')\n"}
    run = await run_hidden_tests(FIXED, tests)
    assert not run.passed and "is a file of the code under test" in run.reason, run.reason


STAR = (
    "import math\n\nimport pytest\n\nfrom checks import check\nfrom calc import *\n\n\n"
    "def test_add():\n    assert math.isclose(add(0.1, 0.2), 0.3)\n\n\n"
    "def test_approx():\n    assert add(2, 3) == pytest.approx(5)\n\n\n"
    "def test_check():\n    check(add(2, 3), 5)\n"
)


async def test_a_star_import_never_rebinds_the_tests_own_names() -> None:
    tests = {"checks.py": CHECK, "test_star.py": STAR}
    run = await run_hidden_tests(FIXED, tests)
    assert run.passed, run.reason
    # Its module exports a `math` whose isclose says yes, a `pytest` whose approx equals
    # anything and a `check` that checks nothing: the tests keep their own.
    forged = BROKEN["calc.py"] + (
        "import math\nimport types\n\nmath.isclose = lambda *a, **k: True\n\n\n"
        "class Anything:\n    def __eq__(self, other):\n        return True\n\n\n"
        "pytest = types.SimpleNamespace(approx=lambda *a, **k: Anything())\n\n\n"
        "def check(got, want):\n    pass\n\n\n"
        "__all__ = ['add', 'math', 'pytest', 'check']\n"
    )
    run = await run_hidden_tests({"calc.py": forged}, tests)
    assert not run.passed and "(and 2 more)" in run.reason, run.reason


# Checks that lean on builtins, after a star import of the model's module.
STAR_BUILTINS = """from calc import *


def test_abs():
    assert abs(add(0.1, 0.2) - 0.3) < 1e-9


def test_all():
    assert all([add(a, b) == a + b for a, b in [(1, 2), (3, 4)]])


def test_sorted():
    assert sorted([add(3, 1), add(1, 1)]) == [2, 4]


def test_len():
    assert len(str(add(2, 3))) == 1
"""


async def test_a_star_import_never_shadows_a_builtin() -> None:
    tests = {"test_star.py": STAR_BUILTINS}
    run = await run_hidden_tests(FIXED, tests)
    assert run.passed, run.reason
    # Its module defines an `abs`, `all`, `sorted` and `len` that make every check hold: the
    # tests keep the builtins.
    forged = BROKEN["calc.py"] + (
        "abs = lambda x: 0\nall = lambda values: True\nsorted = lambda values: [2, 4]\n"
        "len = lambda value: 1\n"
    )
    run = await run_hidden_tests({"calc.py": forged}, tests)
    assert not run.passed and "(and 3 more)" in run.reason, run.reason
    assert "leaves the builtins abs, all, len, sorted as they are" in run.output_tail
    # A builtin's name is still the model's when the test imports it by name.
    tests = {
        "test_named.py": "from calc import sorted\n\n\ndef test_it():\n    assert sorted(1) == [2, 4]\n"
    }
    run = await run_hidden_tests({"calc.py": forged}, tests)
    assert run.passed, run.reason


SESSION = (
    "class Session:\n    def __init__(self, *ignored):\n        self.ignored = ignored\n\n"
    "    def __enter__(self):\n        return self\n\n"
    "    def __exit__(self, kind, exc, tb):\n        return {swallow}\n\n"
    "    def get(self, key):\n        raise KeyError(key)\n\n\n"
)
# What `suppress(KeyError)` does: only what it was told to ignore.
NAMED_ONLY = "kind is not None and issubclass(kind, self.ignored)"
IN_SESSION = """import pytest

from calc import Session, add


def test_add_in_a_session():
    with Session():
        assert add(2, 3) == 5


def test_fail_in_a_session():
    with Session():
        if add(2, 3) != 5:
            pytest.fail("wrong sum")


def test_a_missing_key_is_suppressed():
    with Session(KeyError) as s:
        s.get("k")
    with Session((LookupError, ValueError)):
        {}["k"]
"""


@pytest.mark.parametrize("isolate", [True, False])
async def test_the_models_context_manager_suppresses_what_the_test_names(isolate: bool) -> None:
    model = {"calc.py": SESSION.format(swallow=NAMED_ONLY) + FIXED["calc.py"]}
    run = await run_hidden_tests(model, {"test_session.py": IN_SESSION}, isolate=isolate)
    assert run.passed, run.reason + "\n" + run.output_tail


async def test_the_models_context_manager_cannot_swallow_a_failed_check() -> None:
    # Its __exit__ still runs, and suppresses what the test named to it (the KeyError), never
    # the tests' failed assert or pytest.fail.
    model = {"calc.py": SESSION.format(swallow="True") + FIXED["calc.py"]}
    run = await run_hidden_tests(model, {"test_session.py": IN_SESSION})
    assert run.passed, run.reason
    model = {"calc.py": SESSION.format(swallow="True") + BROKEN["calc.py"]}
    run = await run_hidden_tests(model, {"test_session.py": IN_SESSION})
    assert not run.passed and "assert -1 == 5" in run.reason, run.reason
    assert "(and 1 more)" in run.reason, run.reason


# contextlib.suppress as a model would write it (a class, a generator, async), used as honest
# tests do: what they name is suppressed, whoever raised it; anything else goes on.
SUPPRESS = {
    "quiet.py": """import contextlib


class Invalid(ValueError):
    pass


class suppress:
    def __init__(self, *kinds):
        self.kinds = kinds

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        return kind is not None and issubclass(kind, self.kinds)

    async def __aenter__(self):
        return self

    async def __aexit__(self, kind, exc, tb):
        return self.__exit__(kind, exc, tb)


@contextlib.contextmanager
def ignoring(*kinds):
    try:
        yield
    except kinds:
        pass


def parse(text):
    if not text.isdigit():
        raise Invalid(text)
    return int(text)
"""
}
SUPPRESS_TESTS = {
    "test_quiet.py": """import asyncio
import contextlib

import pytest

from quiet import Invalid, ignoring, parse, suppress


class Mine(KeyError):
    pass


def test_what_it_is_told_to_suppress():
    with suppress(ValueError):
        parse("x")
    with suppress(Invalid):
        parse("x")
    with ignoring(KeyError, IndexError):
        [][1]
    with suppress(KeyError):
        raise Mine("the test's own subclass")
    with contextlib.ExitStack() as stack:
        stack.enter_context(suppress(ZeroDivisionError))
        1 / 0


def test_what_it_is_not_told_goes_on():
    with pytest.raises(TypeError):
        with suppress(ValueError):
            raise TypeError("not named")
    with pytest.raises(Invalid):
        with ignoring(KeyError):
            parse("x")


def test_async_suppress():
    async def use():
        async with suppress(LookupError):
            {}["k"]
        return "after"

    assert asyncio.run(use()) == "after"
"""
}


@pytest.mark.parametrize("isolate", [True, False])
async def test_a_models_suppress_works_as_the_test_expects(isolate: bool) -> None:
    run = await run_hidden_tests(SUPPRESS, SUPPRESS_TESTS, isolate=isolate)
    assert run.passed, run.reason + "\n" + run.output_tail


APPROX = """import datetime

import numpy as np
import pytest

from calc import add, elapsed, mean


def test_add():
    assert add(0.1, 0.2) == pytest.approx(0.3)


def test_mean():
    assert mean([1, 2]) == pytest.approx(1.5)


def test_elapsed():
    assert elapsed() == pytest.approx(datetime.timedelta(seconds=5), abs=datetime.timedelta(0))
"""
APPROX_HONEST = """import datetime

import numpy as np


def add(a, b):
    return a + b


def mean(values):
    return np.mean(values)


def elapsed():
    return datetime.timedelta(seconds=5)
"""
# Vacuous answers: an empty array (every one of its no elements is close), an object whose
# __array__ is empty, one that says the difference to what it is compared with is nothing.
APPROX_VACUOUS = """import datetime

import numpy as np


def add(a, b):
    return np.array([])


class Empty:
    def __array__(self, *args, **kwargs):
        return np.array([])


def mean(values):
    return Empty()


class NoDifference:
    def __rsub__(self, other):
        return datetime.timedelta(0)


def elapsed():
    return NoDifference()
"""


def _landlock() -> bool:
    try:
        os.close(_xproc_confine.landlock_ruleset([], [], []))
    except OSError:
        return False
    return True


# The model's script, run by the tests as a CLI: it adds its arguments, and, asked to look,
# reports which of the given paths it could list or read.
CLI = """import os
import sys


def add(a, b):
    return a + b


if __name__ == "__main__":
    if sys.argv[1] == "look":
        for path in sys.argv[2:]:
            try:
                os.listdir(path) if os.path.isdir(path) else open(path).read()
                print("reached", path)
            except OSError:
                print("refused", path)
        open("from_child.txt", "w").write("written")
    else:
        print(add(int(sys.argv[1]), int(sys.argv[2])))
"""
RUNS_THE_CLI = """import os
import subprocess
import sys


def run(*args):
    return subprocess.run([sys.executable, "calc.py", *args], capture_output=True, text=True)


def test_the_cli_adds():
    assert run("2", "3").stdout == "5\\n"
    assert os.system(f"{sys.executable} calc.py 2 3 > sum.txt") == 0
    assert open("sum.txt").read() == "5\\n"


def test_the_cli_reaches_the_work_dir_and_tmp_path_only(tmp_path):
    (tmp_path / "in.txt").write_text("x")
    report = sys.argv[sys.argv.index("--junitxml") + 1]
    private = [os.path.dirname(__file__), __file__, sys.argv[1], os.path.dirname(report)]
    out = run("look", str(tmp_path / "in.txt"), "/usr/lib", *private).stdout.splitlines()
    assert out == [f"reached {tmp_path / 'in.txt'}", "reached /usr/lib"] + [
        f"refused {p}" for p in private
    ]
    assert open("from_child.txt").read() == "written"
"""


@pytest.mark.skipif(not _landlock(), reason="the kernel has no Landlock")
async def test_a_process_the_tests_start_cannot_reach_the_hidden_tests() -> None:
    run = await run_hidden_tests({"calc.py": CLI}, {"test_cli.py": RUNS_THE_CLI})
    assert run.passed, run.reason + "\n" + run.output_tail
    # The attack it stops: the CLI's process copies the hidden tests (their directory is in
    # the mount table) into the work dir, where the model's own process reads the expected
    # values from them.
    leak = (
        "import glob, os, re, sys\n\n\n"
        "def add(a, b):\n"
        "    if os.path.exists('leak.txt'):\n"
        "        for x, y, z in re.findall(r'add\\((\\d+), (\\d+)\\) == (\\d+)', "
        "open('leak.txt').read()):\n"
        "            if (int(x), int(y)) == (a, b):\n"
        "                return int(z)\n"
        "    return a - b\n\n\n"
        "if __name__ == '__main__':\n"
        "    for line in open('/proc/self/mountinfo'):\n"
        "        found = line.split()[4]\n"
        "        pattern = found + '/**/test_*.py' if '/tests-' in found else ''\n"
        "        for p in glob.glob(pattern, recursive=True):\n"
        "            try:\n"
        "                open('leak.txt', 'a').write(open(p).read())\n"
        "            except OSError:\n"
        "                pass\n"
    )
    tests = {
        "test_a_cli.py": (
            "import subprocess, sys\n\n\ndef test_runs():\n"
            "    assert subprocess.run([sys.executable, 'calc.py']).returncode == 0\n"
        ),
        "test_b_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    }
    run = await run_hidden_tests({"calc.py": leak}, tests)
    assert not run.passed and "assert -1 == 5" in run.reason, run.reason


# Tests that fork with multiprocessing: the child runs the tests' own code under the rules of a
# process they start; a fresh interpreter (spawn, forkserver) is refused.
FORKS = """import multiprocessing
import os
import sys

import pytest

from calc import add


def look(conn, paths):
    found = []
    for path in paths:
        try:
            os.listdir(path) if os.path.isdir(path) else open(path).read()
            found.append("reached")
        except OSError:
            found.append("refused")
    conn.send(found)


def call_add(conn):
    try:
        conn.send(add(2, 3))
    except Exception as exc:
        conn.send(str(exc))


def in_a_child(target, *args, method="fork"):
    ctx = multiprocessing.get_context(method)
    recv, send = ctx.Pipe(False)
    child = ctx.Process(target=target, args=(send, *args))
    child.start()
    got = recv.recv() if recv.poll(30) else None
    child.join(30)
    return got


def test_a_forked_child_reaches_the_work_dir_and_tmp_path_only(tmp_path):
    (tmp_path / "in.txt").write_text("x")
    report = sys.argv[sys.argv.index("--junitxml") + 1]
    private = [__file__, os.path.dirname(__file__), sys.argv[1], os.path.dirname(report)]
    got = in_a_child(look, [str(tmp_path / "in.txt"), os.getcwd(), *private])
    assert got == ["reached", "reached"] + ["refused"] * len(private)
    assert add(2, 3) == 5


def test_a_forked_child_cannot_call_the_model():
    assert "from the tests' own process only" in in_a_child(call_add)
    assert add(2, 3) == 5


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_fresh_interpreter_is_refused(method):
    with pytest.raises(PermissionError, match="fresh Python"):
        in_a_child(look, [], method=method)
"""


@pytest.mark.skipif(not _landlock(), reason="the kernel has no Landlock")
async def test_a_process_the_tests_fork_is_confined() -> None:
    run = await run_hidden_tests(FIXED, {"test_forks.py": FORKS})
    assert run.passed, run.reason + "\n" + run.output_tail


# The model's module, imported where the hidden tests are mounted, copies them to the work dir,
# where its own process reads the expected values.
LEAKS = {
    "calc.py": (
        "import glob, os, re\n\n"
        "for line in open('/proc/self/mountinfo'):\n"
        "    found = line.split()[4]\n"
        "    for p in glob.glob(found + '/**/test_*.py', recursive=True) if '/tests-' in found"
        " else []:\n"
        "        try:\n"
        "            open('leak.txt', 'a').write(open(p).read())\n"
        "        except OSError:\n"
        "            pass\n\n\n"
        "def add(a, b):\n"
        "    if os.path.exists('leak.txt'):\n"
        "        for x, y, z in re.findall(r'add\\((\\d+), (\\d+)\\) == (\\d+)', "
        "open('leak.txt').read()):\n"
        "            if (int(x), int(y)) == (a, b):\n"
        "                return int(z)\n"
        "    return a - b\n"
    )
}
# A test that puts the work dir on sys.path (to find the model's code in-process) and runs a
# function of its own in a spawned child, which imports the test module again.
SPAWNS = {
    "test_a_spawn.py": """import multiprocessing
import os
import sys

sys.path.insert(0, os.getcwd())

from calc import add


def square(conn, x):
    conn.send(x * x)


def test_square_in_a_child():
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(False)
    child = ctx.Process(target=square, args=(send, 3))
    child.start()
    assert recv.poll(30) and recv.recv() == 9
    child.join(30)
""",
    "test_b_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
}


async def test_a_spawned_interpreter_never_loads_the_models_files() -> None:
    # Were the child started, it would run the model's calc.py next to the hidden tests, and
    # test_b would pass on the leaked expectations.
    run = await run_hidden_tests(LEAKS, SPAWNS)
    assert not run.passed, run.reason
    assert "fresh Python" in run.reason, run.reason
    assert "(and 1 more)" in run.reason, "the leak reached the model: " + run.reason


# The model's own code starting processes (fork and spawn) in its own process: its business.
PARALLEL = {
    "calc.py": """import multiprocessing


def _square(conn, x):
    conn.send(x * x)


def squares(values, method):
    ctx = multiprocessing.get_context(method)
    out = []
    for x in values:
        recv, send = ctx.Pipe(False)
        child = ctx.Process(target=_square, args=(send, x))
        child.start()
        out.append(recv.recv() if recv.poll(30) else None)
        child.join(30)
    return out
"""
}
PARALLEL_TESTS = {
    "test_parallel.py": """import pytest

from calc import squares


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_squares(method):
    assert squares([2, 3], method) == [4, 9]
"""
}


@pytest.mark.parametrize("isolate", [True, False])
async def test_the_models_own_processes_work(isolate: bool) -> None:
    run = await run_hidden_tests(PARALLEL, PARALLEL_TESTS, isolate=isolate)
    assert run.passed, run.reason + "\n" + run.output_tail


@pytest.mark.parametrize("isolate", [True, False])
async def test_pytest_approx_never_holds_vacuously(isolate: bool) -> None:
    tests = {"test_approx.py": APPROX}
    run = await run_hidden_tests({"calc.py": APPROX_HONEST}, tests, isolate=isolate)
    assert run.passed, run.reason
    run = await run_hidden_tests({"calc.py": APPROX_VACUOUS}, tests, isolate=isolate)
    assert not run.passed and "test_add failed" in run.reason, run.reason
    assert "(and 2 more)" in run.reason, run.reason


# ---------------------------------------------------------------- a hostile model process


class FakeSubject:
    """The model's end of the pipe, answering each request with whatever a test scripts."""

    def __init__(self, answer: Callable[[dict[str, Any], int], Any]) -> None:
        self.to_tests_r, self.to_tests_w = os.pipe()
        self.to_subject_r, self.to_subject_w = os.pipe()
        self.answer = answer
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()
        self.remote = _xproc_tests.Remote(self.to_tests_r, self.to_subject_w)

    def serve(self) -> None:
        try:
            while True:
                message = _xproc_wire.read_frame(self.to_subject_r)
                if self.answer(message, self.to_tests_w) == "exit":
                    self._close(self.to_tests_w)  # as its process ending would
                    return
        except (_xproc_wire.ProtocolError, OSError):
            pass

    def close(self) -> None:
        # The tests' write end first: the fake's read then ends and its thread with it, before
        # any fd number can be reused by the next test's pipes.
        self._close(self.to_subject_w)
        self.thread.join(5)
        assert not self.thread.is_alive()
        for fd in (self.to_tests_r, self.to_tests_w, self.to_subject_r):
            self._close(fd)

    closed: set[int]

    def _close(self, fd: int) -> None:
        if fd not in self.__dict__.setdefault("closed", set()):
            self.closed.add(fd)
            os.close(fd)


def reply(value: Any) -> Callable[[dict[str, Any], int], None]:
    """Answer every request with `{"re": id, "v": value}`."""

    def answer(message: dict[str, Any], fd: int) -> None:
        _xproc_wire.write_frame(fd, {"re": message["id"], "v": value})

    return answer


def raw(data: bytes) -> Callable[[dict[str, Any], int], None]:
    def answer(message: dict[str, Any], fd: int) -> None:
        os.write(fd, data)

    return answer


def deep(n: int) -> Any:
    value: Any = 1
    for _ in range(n):
        value = [value]
    return value


HOSTILE = [
    ("an unknown tag", reply({"$evil": 1}), "unknown value tag"),
    ("a builtin exception tag naming a function", reply({"$bx": "eval"}), "not a builtin"),
    ("a builtin type tag naming a function", reply({"$bt": "open"}), "not a builtin"),
    ("a huge hex int", reply({"$i": "f" * 2_000_000}), "large integer"),
    ("an int past the exact JSON range", reply(2**60), "exact JSON range"),
    ("nesting past the limit", reply(deep(500)), "nested too deeply"),
    (
        "a reply to a request never made",
        lambda m, fd: _xproc_wire.write_frame(fd, {"re": 99, "v": 1}),
        "not asked",
    ),
    ("a frame over the size limit", raw(b"\xff\xff\xff\xff"), "over the"),
    ("a frame that is not JSON", raw(b"\x00\x00\x00\x03abc"), "not valid JSON"),
    ("a frame that is a JSON list", raw(b"\x00\x00\x00\x02[]"), "not a JSON object"),
    ("a handle of the tests never sent", reply({"$own": 7}), "never sent"),
    (
        "a callback to something it was not given",
        lambda m, fd: _xproc_wire.write_frame(
            fd, {"id": 1, "op": "getattr", "obj": {"$own": 1}, "name": "x"}
        ),
        "may only call",
    ),
    (
        "an exception whose class is not one",
        lambda m, fd: _xproc_wire.write_frame(fd, {"re": m["id"], "x": {"type": 5}}),
        "not an exception class",
    ),
    ("a numpy array of objects", reply({"$nd": ["|O", [1], "AAAAAAAAAAA="]}), "not sent by value"),
    (
        "a numpy array shorter than its shape",
        reply({"$nd": ["<f8", [2], "AAAAAAAAAAA="]}),
        "do not match",
    ),
    (
        "a named tuple with a keyword for a field",
        reply({"$nt": [{"$ref": 1}, "P", ["class"], [1]]}),
        "fields are malformed",
    ),
    (
        "a named tuple whose class is not a handle",
        reply({"$nt": [5, "P", ["x"], [1]]}),
        "not a handle",
    ),
    (
        "a log record at a level past any",
        lambda m, fd: _xproc_wire.write_frame(
            fd, {"re": m["id"], "v": 1, "log": [["x", 999, "t", "p", 1, "f"]]}
        ),
        "log record is malformed",
    ),
    ("the process exiting mid-request", lambda m, fd: "exit", "process ended"),
    (
        "a warning whose category is no Warning",
        lambda m, fd: _xproc_wire.write_frame(
            fd, {"re": m["id"], "v": 1, "warn": [[{"$bx": "ValueError"}, "x", "f.py", 1]]}
        ),
        "not a Warning class",
    ),
]


@pytest.mark.parametrize(("name", "answer", "why"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_model_process_gets_an_error_not_a_foothold(
    name: str, answer: Callable[[dict[str, Any], int], None], why: str
) -> None:
    fake = FakeSubject(answer)
    try:
        with pytest.raises(_xproc_tests.CodeUnderTestError, match=why):
            fake.remote.getattr(_xproc_tests.RemoteObject(1, fake.remote), "x")
        # Once broken, every later request fails at once (no half-read frame is trusted).
        with pytest.raises(_xproc_tests.CodeUnderTestError):
            fake.remote.getattr(_xproc_tests.RemoteObject(1, fake.remote), "y")
    finally:
        fake.close()


@pytest.mark.parametrize(
    ("method", "answer", "why"),
    [
        (bool, {"$ref": 5}, "bool()"),
        (len, -1, "negative"),
        (len, True, "len()"),
        (str, 5, "str()"),
        (hash, "x", "hash()"),
        (lambda h: 3 in h, 1, "`in`"),
    ],
)
def test_pythons_protocols_take_only_their_exact_types(method: Any, answer: Any, why: str) -> None:
    fake = FakeSubject(reply(answer))
    try:
        with pytest.raises((TypeError, ValueError), match=why):
            method(_xproc_tests.RemoteObject(1, fake.remote))
    finally:
        fake.close()


def test_a_model_object_never_equals_or_orders_against_a_tests_value() -> None:
    fake = FakeSubject(reply(True))  # it would say "equal" to anything, if asked
    try:
        handle = _xproc_tests.RemoteObject(1, fake.remote)
        assert handle != 5 and not (handle == 5) and not (5 == handle)
        with pytest.raises(TypeError):
            _ = handle < 5
        assert (handle == _xproc_tests.RemoteObject(2, fake.remote)) is True  # its own: asked
    finally:
        fake.close()


def _dict(**items: Any) -> dict[str, Any]:
    """A dict as the wire carries it."""
    return {"$d": [[k, v] for k, v in items.items()]}


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ([], "not a list of parameters"),
        (_dict(params=[_dict(name="a", kind=9)]), "kind"),
        (_dict(params=[_dict(name="not a name", kind=0)]), "not a valid parameter name"),
        (_dict(params=[_dict(name="a", kind=4), _dict(name="b", kind=0)]), "wrong parameter order"),
    ],
)
def test_a_malformed_signature_is_an_error(answer: Any, why: str) -> None:
    fake = FakeSubject(reply(answer))
    try:
        with pytest.raises(_xproc_tests.CodeUnderTestError, match=why):
            _ = _xproc_tests.RemoteObject(1, fake.remote).__signature__
    finally:
        fake.close()


def _kill_tests_process(marker: str) -> bool:
    """SIGKILL the process whose command line names `marker` (one run's hidden test file)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        # pytest itself (`python -I -c ...`), not the bwrap and launcher that started it.
        if (
            argv[1:2] == [b"-I"]
            and b"--junitxml" in argv
            and any(marker.encode() in a for a in argv)
        ):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry), signal.SIGKILL)
                return True
    return False


@pytest.mark.parametrize("isolate", [True, False])
async def test_a_tests_process_killed_from_outside_is_run_again_only_when_isolated(
    isolate: bool,
) -> None:
    # A SIGKILL from outside the sandbox (seen in CI as "exited early (code 137)", its sender
    # unknown) failed an honest fix. Isolated, the model's code cannot signal the tests'
    # process, so such a death says nothing about the code; in-process, the code could kill
    # it itself: a failure.
    name = f"test_killed_{secrets.token_hex(4)}.py"
    hidden = {name: "import time\nfrom calc import add\n\n\ndef test_add():\n"
              "    time.sleep(2)\n    assert add(2, 3) == 5\n"}  # fmt: skip
    fixed = {"calc.py": "def add(a, b):\n    return a + b\n"}
    running = asyncio.ensure_future(run_hidden_tests(fixed, hidden, isolate=isolate))
    await wait_until(lambda: running.done() or _kill_tests_process(name), "the tests' process")
    run = await running
    if isolate:
        assert run.passed, run.reason
        assert "second run: the first one's test process was killed by a SIGKILL" in run.reason
    else:
        assert not run.passed
        assert run.reason.startswith("report missing: the test process exited early (code 137")
