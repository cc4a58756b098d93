"""A plugin env's own Python source travels with its spec, so services can import it.

`rollout push` runs in the user's folder, where `example_plugins.counter` imports; the
registry, actors and verifiers run elsewhere (other processes, other machines). When the
entrypoint's top-level module is the user's own code (not an installed package), its `.py`
files are bundled into `config.sources` at push time. No service imports them: a plugin host
(plugin_host/) writes them into its sandbox's own private /tmp and imports them there, after
the standard library on sys.path. Installed packages are dependencies: they must be installed
where the services run, like any other.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import site
import sysconfig
from pathlib import Path, PurePosixPath

from rollout.shared.errors import RolloutError

MAX_SOURCE_BYTES = 2 * 1024 * 1024
MAX_SOURCE_FILES = 200


def _installed_roots() -> list[Path]:
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    roots.add(site.getusersitepackages())
    return [Path(r).resolve() for r in roots if r]


def _is_installed(path: Path) -> bool:
    return any(path.is_relative_to(root) for root in _installed_roots())


def bundle_sources(entrypoint: str) -> dict[str, str]:
    """The `.py` files of the entrypoint's top-level module when it is the user's own code."""
    top = entrypoint.partition(":")[0].split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return {}  # validation names the import problem
    if spec is None:
        return {}
    locations = list(spec.submodule_search_locations or [])
    if spec.origin in (None, "namespace") and locations:
        origin = Path(locations[0]).resolve() / "__init__.py"  # a namespace package's folder
    elif not spec.origin or spec.origin in ("built-in", "frozen"):
        return {}
    else:
        origin = Path(spec.origin).resolve()
    if _is_installed(origin):
        return {}
    if locations:
        package = origin.parent
        files = sorted(
            p for p in package.rglob("*.py") if "__pycache__" not in p.relative_to(package).parts
        )
        base = package.parent
    else:
        files, base = [origin], origin.parent
    if len(files) > MAX_SOURCE_FILES:
        raise RolloutError(
            f"config.entrypoint: package {top!r} has {len(files)} .py files; at most "
            f"{MAX_SOURCE_FILES} are bundled with a plugin env (install it on the services instead)"
        )
    sources = {p.relative_to(base).as_posix(): _utf8(p, base) for p in files}
    size = sum(len(text.encode()) for text in sources.values())
    if size > MAX_SOURCE_BYTES:
        raise RolloutError(
            f"config.entrypoint: package {top!r} is {size} bytes of source; at most "
            f"{MAX_SOURCE_BYTES} are bundled with a plugin env (install it on the services instead)"
        )
    return sources


_MISSING_MODULE = re.compile(r"No module named '([A-Za-z_][A-Za-z0-9_.]*)'")


def unbundled_hint(error: str, sources: dict[str, str] | None) -> str:
    """What to do when the plugin misses a module of the user's own that was not bundled.

    Only the entrypoint's top-level module (or package) travels with the env: a sibling module
    it imports imports here, in the user's folder, but not in the plugin host.
    """
    match = _MISSING_MODULE.search(error)
    if match is None:
        return ""
    top = match.group(1).split(".")[0]
    if any(PurePosixPath(path).parts[0].removesuffix(".py") == top for path in sources or {}):
        return ""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return ""
    if spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        return ""
    if _is_installed(Path(spec.origin).resolve()):
        return ""
    return (
        f" ({top!r} is your own code, which is not sent with the env: only the entrypoint's "
        f"module or package is; put {top!r} in one package with it, a folder with an "
        "__init__.py, like examples/example_plugins)"
    )


def _utf8(path: Path, base: Path) -> str:
    """A source file's text; one that is not UTF-8 is named by file and line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise RolloutError(
            f"config.entrypoint: {path.relative_to(base).as_posix()}:{line}: not UTF-8 text "
            f"(byte 0x{data[exc.start]:02x}); plugin sources are sent as UTF-8: save it as UTF-8"
        ) from None


def check_sources(sources: object) -> dict[str, str]:
    """Relative `.py` paths to text, nothing that could write outside its folder."""
    if not isinstance(sources, dict):
        raise RolloutError(f"config.sources must be a mapping, got {type(sources).__name__}")
    for path, text in sources.items():
        pure = PurePosixPath(str(path))
        if (
            not isinstance(text, str)
            or pure.is_absolute()
            or ".." in pure.parts
            or pure.suffix != ".py"
            or "\x00" in str(path)
        ):
            raise RolloutError(
                f"config.sources[{path!r}]: must be a relative .py path inside the plugin "
                "and its text"
            )
    return sources
