"""The project's import graph, read from its source: every import, at module level or in a function.

Run it (`python tests/contracts/import_graph.py`) to print the floors' violations, the import
circles and the imports inside functions that defer nothing heavy.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Import package -> folder (pyproject's package-dir; tests/contracts/test_packaging.py keeps it).
FOLDERS = {"rollout": "sdk/rollout", "rollout.shared": "shared", "rollout.services": "services"}
# Optional dependencies that cost seconds or gigabytes to import: deferring them inside a
# function keeps the CLI and the services that never train or browse light.
HEAVY = frozenset(
    {
        "accelerate",
        "aioboto3",
        "art",
        "datasets",
        "fastmcp",
        "gcloud",
        "gguf",
        "openenv",
        "openenv_core",
        "peft",
        "playwright",
        "selenium",
        "torch",
        "transformers",
        "trl",
        "uvicorn",
        "verifiers",
        "vllm",
    }
)


# What building the CLI's parser must not load: every `rollout` command builds every verb's
# parser before it runs one, so the CLI's modules also defer these to the verbs that use them
# (tests/contracts/test_cli_startup.py checks what `rollout --help` imports).
CLI_STARTUP_HEAVY = HEAVY | frozenset(
    {
        "asyncpg",
        "bcrypt",
        "faststream",
        "httpx",
        "jinja2",
        "nats",
        "pydantic",
        "rich",
        "starlette",
        "structlog",
    }
)


@dataclass(frozen=True)
class Edge:
    """One import of a project module by another."""

    src: str
    dst: str
    line: int
    in_function: bool
    type_checking: bool

    def __str__(self) -> str:
        where = " (in a function)" if self.in_function else ""
        return f"{self.src}:{self.line} imports {self.dst}{where}"


@dataclass
class Graph:
    """Project modules, the imports between them, and the external packages each imports."""

    modules: dict[str, Path]
    edges: list[Edge]
    # module -> top-level names of external packages it imports at module level
    external: dict[str, set[str]]


def _module_files() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for prefix, folder in FOLDERS.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([prefix, *parts])] = path
    return out


def _resolve(name: str, known: set[str]) -> str | None:
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _requires(node: ast.AST) -> str | None:
    """The peer a module-level `require("name")` call loads (shared/interop/backends.py)."""
    if (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Name)
        and node.value.func.id == "require"
        and node.value.args
        and isinstance(node.value.args[0], ast.Constant)
    ):
        return str(node.value.args[0].value)
    return None


def build() -> Graph:
    """Read every module of the three folders."""
    files = _module_files()
    known = set(files)
    edges: list[Edge] = []
    external: dict[str, set[str]] = defaultdict(set)
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]

        def visit(
            node: ast.AST,
            in_function: bool,
            type_checking: bool,
            name: str = name,
            package: str = package,
        ) -> None:
            for child in ast.iter_child_nodes(node):
                fn = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                tc = type_checking or _is_type_checking(child)
                targets: list[str] = []
                if isinstance(child, ast.Import):
                    targets = [alias.name for alias in child.names]
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                        module = ".".join(base + ([child.module] if child.module else []))
                    else:
                        module = child.module or ""
                    # `from pkg import sub` names the submodule; `from mod import obj`, the module.
                    targets = [f"{module}.{alias.name}" for alias in child.names] or [module]
                if not fn and not tc and _requires(child):
                    # `require("art")` at module level: the module imports that peer on load.
                    external[name].add(_requires(child))
                found = set()
                for target in targets:
                    resolved = _resolve(target, known)
                    if resolved is None:
                        if not fn and not tc and not target.startswith("rollout"):
                            external[name].add(target.split(".")[0])
                    elif resolved != name:
                        found.add(resolved)
                for dst in sorted(found):
                    edges.append(Edge(name, dst, child.lineno, fn, tc))
                visit(child, fn, tc)

        visit(ast.parse(path.read_text(), str(path)), False, False)
    return Graph(files, edges, dict(external))


def floor(module: str) -> str:
    """`sdk`, `cli`, `shared`, `catalog` or `service:<name>`."""
    if module == "rollout.services" or module == "rollout.services.catalog":
        return "catalog"
    if module.startswith("rollout.services."):
        return "service:" + module.split(".")[2]
    if module.startswith("rollout.shared"):
        return "shared"
    if module == "rollout.cli" or module.startswith("rollout.cli."):
        return "cli"
    return "sdk"


def floor_violations(graph: Graph) -> list[Edge]:
    """Imports that go up a floor or across services.

    shared imports only shared; a service, shared and its own folder; the catalog (the
    AsyncAPI document of every broker), services' entry points; the SDK library (client,
    environment, plans, snapshots), shared; the CLI, anything (it also runs services in process:
    `rollout ui`, `rollout serve-model`, `rollout admin rebuild`).
    """
    bad = []
    for edge in graph.edges:
        src, dst = floor(edge.src), floor(edge.dst)
        if src == dst or dst == "shared" or src == "cli":
            continue
        if src == "catalog" and dst.startswith("service:") and edge.dst.endswith(".main"):
            continue
        if src == "sdk" and dst == "sdk":
            continue
        bad.append(edge)
    return bad


def circles(graph: Graph, *, module_level_only: bool = False) -> list[list[str]]:
    """Strongly connected sets of modules (each a circle of imports), largest first."""
    adjacent: dict[str, set[str]] = defaultdict(set)
    for edge in graph.edges:
        if edge.type_checking or (module_level_only and edge.in_function):
            continue
        adjacent[edge.src].add(edge.dst)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    # Raised for this walk only: a limit left raised made tests that rely on the interpreter's
    # (tests/envs/test_deep_values.py) fail when they ran after this in the same worker.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(10_000, limit))

    def connect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in adjacent[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    try:
        for module in sorted(adjacent):
            if module not in index:
                connect(module)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(found, key=len, reverse=True)


def heavy_closure(graph: Graph, heavy_set: frozenset[str] = HEAVY) -> dict[str, bool]:
    """Whether importing each module (its module-level imports, transitively) loads a heavy one."""
    adjacent: dict[str, set[str]] = defaultdict(set)
    for edge in graph.edges:
        if not edge.in_function and not edge.type_checking:
            adjacent[edge.src].add(edge.dst)
    memo: dict[str, bool] = {}

    def heavy(module: str, seen: frozenset[str]) -> bool:
        if module in memo:
            return memo[module]
        if graph.external.get(module, set()) & heavy_set:
            memo[module] = True
            return True
        # Importing a module first imports its package (`rollout.shared.envs.judged` loads
        # rollout/shared/envs/__init__.py and all it imports).
        parent = module.rpartition(".")[0]
        above = [parent] if parent in graph.modules and parent not in seen else []
        result = any(
            heavy(d, seen | {module}) for d in [*adjacent[module], *above] if d not in seen
        )
        memo[module] = result
        return result

    return {m: heavy(m, frozenset()) for m in graph.modules}


def deferred_for_nothing(graph: Graph) -> list[Edge]:
    """Imports inside functions of project modules whose import loads nothing heavy.

    For the CLI's modules, heavy is also what its parser must not load (CLI_STARTUP_HEAVY).
    """
    heavy = heavy_closure(graph)
    startup = heavy_closure(graph, CLI_STARTUP_HEAVY)
    return [
        e
        for e in graph.edges
        if e.in_function
        and not e.type_checking
        and not (startup if floor(e.src) == "cli" else heavy)[e.dst]
    ]


if __name__ == "__main__":
    g = build()
    print(f"{len(g.modules)} modules, {len(g.edges)} imports between them")
    for edge in floor_violations(g):
        print("floor:", edge)
    for circle in circles(g):
        print(f"circle of {len(circle)}:", ", ".join(circle))
    lazy = deferred_for_nothing(g)
    print(
        f"{sum(e.in_function for e in g.edges)} imports inside functions, {len(lazy)} defer nothing heavy"
    )
    for edge in lazy:
        print("   ", edge)
