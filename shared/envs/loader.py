"""Load the Environments a user's .py file defines; errors name the file and line, no traceback."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import threading
import traceback
import uuid
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError

from rollout.shared.envs.coerce import pydantic_problems
from rollout.shared.envs.environment import LOADING_DIR, Environment
from rollout.shared.errors import RolloutError

log = structlog.get_logger(__name__)
# Seconds an env file may take to load before a warning says it is still loading.
SLOW_LOAD_S = 10.0


def _still_loading(file: Path) -> None:
    log.warning(
        "env file still loading",
        file=str(file),
        seconds=SLOW_LOAD_S,
        hint="an env file runs when it is loaded: look for a loop or a slow download at module "
        "level (Ctrl-C stops it; a second Ctrl-C if the first is not enough)",
    )


def _user_frame(exc: BaseException, path: Path) -> int | None:
    """The last line of the user's file in the exception's traceback."""
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            if Path(frame.filename).resolve() == path:
                line = frame.lineno
        except OSError:
            continue
    return line


# An error's own text is cut here: a message of megabytes (a dumped file) buries the file and line.
MAX_MESSAGE_CHARS = 2000


def _said(exc: Any) -> str:
    """`str(exc)`, cut to MAX_MESSAGE_CHARS, or a note when its __str__ itself raises."""
    try:
        text = str(exc)
    except Exception as inner:  # noqa: BLE001 - a user's exception class: said, not raised
        return f"(its message could not be read: {type(inner).__name__})"
    if len(text) > MAX_MESSAGE_CHARS:
        return f"{text[:MAX_MESSAGE_CHARS]}... ({len(text):,} characters)"
    return text


def _raised_in(exc: BaseException, file: Path) -> str:
    """`(raised at FILE:LINE)` when the innermost frame of the author's own code (their
    folder) is in another file than the env file, e.g. a helper module it imports."""
    last = None
    for frame in traceback.extract_tb(exc.__traceback__):
        try:
            path = Path(frame.filename).resolve()
        except (OSError, ValueError):
            continue
        if path.is_relative_to(file.parent) and not _installed(path):
            last = (path, frame.lineno)
    if last is None or last[0] == file:
        return ""
    return f" (raised at {last[0]}:{last[1]})"


# Code that is not the author's even inside their folder: a virtualenv there, and our own.
_NOT_THEIRS = tuple(
    {
        Path(sys.prefix).resolve(),
        Path(sys.base_prefix).resolve(),
        Path(__file__).resolve().parents[1],
    }
)


def _installed(path: Path) -> bool:
    return "site-packages" in path.parts or any(path.is_relative_to(p) for p in _NOT_THEIRS)


def _imported_at(exc: BaseException, file: Path) -> str:
    """`(imported at FILE:LINE)`: where the env file imports the module that does not parse."""
    line = _user_frame(exc, file)
    return f" (imported at {file}:{line})" if line else f" (imported by {file})"


def _collect(namespace: dict[str, Any]) -> list[Any]:
    found: list[Any] = []
    seen: set[int] = set()

    def add(obj: Any) -> None:
        if isinstance(obj, Environment) and id(obj) not in seen:
            seen.add(id(obj))
            found.append(obj)

    for name, value in namespace.items():
        if name.startswith("__"):
            continue
        if isinstance(value, list | tuple):
            for item in value:
                add(item)
        else:
            add(value)
    return found


def load_environments(path: str | Path) -> list[Any]:
    """Run a user's environment file and return every Environment it defines at module level."""
    file = Path(path).expanduser()
    if not file.exists():
        raise RolloutError(f"{file}: no such file")
    if file.is_dir():
        raise RolloutError(f"{file}: is a directory, expected a .py file")
    file = file.resolve()
    if file.suffix != ".py":
        raise RolloutError(f"{file}: expected a .py file")
    module_name = f"_rollout_env_{file.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise RolloutError(f"{file}: cannot be loaded as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Plugin modules and helpers next to the env file import as they would for `python file.py`.
    folder = str(file.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    token = LOADING_DIR.set(file.parent)
    sys.modules[module_name] = module
    # The file's own prints go to stderr: stdout belongs to the command (`--json` documents).
    # A file still running after a while gets one warning: it may loop or fetch at import.
    watch = threading.Timer(SLOW_LOAD_S, _still_loading, (file,))
    watch.daemon = True
    watch.start()
    # sys.stdout is the process's: swapped only from the main thread (a CLI's), never under
    # another thread that prints, nor by two loads at once that would restore it out of order.
    quiet = (
        contextlib.redirect_stdout(sys.stderr)
        if threading.current_thread() is threading.main_thread()
        else contextlib.nullcontext()
    )
    try:
        with quiet:
            spec.loader.exec_module(module)
    except SyntaxError as exc:
        # In a module the file imports, the line is that module's: named with its own path.
        source = Path(exc.filename).resolve() if exc.filename else file
        where = f"{source}:{exc.lineno}" if exc.lineno else str(source)
        via = "" if source == file else _imported_at(exc, file)
        raise RolloutError(f"{where}: syntax error: {_said(exc.msg)}{via}") from None
    except RolloutError as exc:
        line = _user_frame(exc, file)
        where = f"{file}:{line}" if line else str(file)
        raise RolloutError(f"{where}: {exc.message}", problems=exc.problems) from None
    except ValidationError as exc:
        # e.g. Task(instruction=3): one line per field, not pydantic's dump with its links.
        line = _user_frame(exc, file)
        where = f"{file}:{line}" if line else str(file)
        raise RolloutError(
            f"{where}: invalid {exc.title}: {exc.error_count()} problem(s)",
            problems=pydantic_problems(exc),
        ) from None
    except SystemExit as exc:
        raise RolloutError(f"{file}: called sys.exit({exc.code!r}) while loading") from None
    except Exception as exc:
        line = _user_frame(exc, file)
        where = f"{file}:{line}" if line else str(file)
        raised = _raised_in(exc, file)
        raise RolloutError(f"{where}: {type(exc).__name__}: {_said(exc)}{raised}") from None
    finally:
        watch.cancel()
        LOADING_DIR.reset(token)
        sys.modules.pop(module_name, None)
    envs = _collect(vars(module))
    if not envs:
        raise RolloutError(f"{file}: defines no Environment (assign one at module level)")
    return envs


def select_environment(envs: list[Any], slug: str | None) -> list[Any]:
    """All environments, or the one whose slug is `slug` (RolloutError naming the choices)."""
    if slug is None:
        return envs
    chosen = [e for e in envs if getattr(e, "slug", None) == slug]
    if not chosen:
        slugs = ", ".join(repr(getattr(e, "slug", None)) for e in envs)
        raise RolloutError(f"no environment with slug {slug!r} (found: {slugs})")
    return chosen
