"""Plan-time validation: every problem in an environment, each naming its config path.

`validate_environment(env)` never raises on bad input: fuzzed or half-written specs come back as
a list of `path: message` strings (e.g. `config.tools[1].fromArray: no fixture 'orderz'`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from rollout.errors import RolloutError
from rollout.shared.contracts.envspec import (
    TEMPLATE_ALIASES,
    TEMPLATE_CONFIGS,
    TEMPLATES,
    BrowserConfig,
    CodeEditingConfig,
    CustomConfig,
    EnvironmentSpec,
    NemoGymConfig,
    OpenEnvConfig,
    PluginConfig,
    SqlConfig,
    TaskSpec,
    VerifiersConfig,
    VerifierSpec,
    WorkflowConfig,
)
from rollout.shared.envs.coerce import pydantic_problems, raw_environment
from rollout.shared.envs.interpolate import placeholder_refs
from rollout.shared.envs.params import is_json_schema, schema_problems
from rollout.shared.envs.paths import (
    PathError,
    format_path,
    parse_path,
    resolve_path,
)
from rollout.shared.envs.templates import static_tool_names
from rollout.shared.envs.templates.base import ToolError
from rollout.shared.envs.templates.code_editing import check_file_path
from rollout.shared.envs.templates.plugin import PluginError, lease_host, shadowing_problems
from rollout.shared.envs.verifiers import REGISTRY, known_types
from rollout.shared.envs.verifiers.engine import default_verifier

CONTEXT_ROOTS = ("args", "state", "input")
BROWSER_STATE = ("url", "history", "forms", "submissions")


class _Problems(list):
    """A list of problems that can run a check and turn a crash into a problem."""

    def guard(self, where: str, check: Callable[[], None]) -> None:
        try:
            check()
        except Exception as exc:  # validation must report, never crash
            self.append(f"{where}: could not be checked ({type(exc).__name__}: {exc})")


def validate_environment(env_or_spec: Any) -> list[str]:
    """Every problem in an environment (empty list when it is valid)."""
    problems = _Problems()
    try:
        raw = raw_environment(env_or_spec)
    except RolloutError as exc:
        return [str(exc)]
    except Exception as exc:
        return [f"<root>: cannot read the environment ({type(exc).__name__}: {exc})"]
    if not isinstance(raw, dict):
        return [f"<root>: must be an object, got {type(raw).__name__}"]
    try:
        EnvironmentSpec.model_validate(raw)
    except ValidationError as exc:
        problems.extend(pydantic_problems(exc))

    for key in ("config", "tasks", "verifier"):
        problems.extend(_non_json(raw.get(key), key))
    for key, value in raw.items():
        if (
            key not in ("config", "tasks", "verifier")
            and isinstance(value, str)
            and "\x00" in value
        ):
            problems.append(f"{key}: contains a NUL character")

    template = raw.get("template")
    if isinstance(template, str):
        template = TEMPLATE_ALIASES.get(template.lower(), template)
    config_raw = raw.get("config")
    config: Any = None
    tools: list[str] | None = None
    if isinstance(template, str) and template not in TEMPLATES:
        problems.append(f"template: unknown template {template!r} (known: {', '.join(TEMPLATES)})")
    elif isinstance(template, str) and isinstance(config_raw, dict):
        try:
            config = TEMPLATE_CONFIGS[template].model_validate(config_raw)
        except ValidationError as exc:
            problems.extend(pydantic_problems(exc, "config"))
        if config is not None:
            tools = static_tool_names(template, config)
            checker = _CONFIG_CHECKS.get(template)
            if checker:
                found: list[str] = []
                problems.guard("config", lambda: checker(config, found))
                problems.extend(found)
            if isinstance(config, PluginConfig):
                tools = _plugin_tools(config, problems)

    tasks = _tasks(raw.get("tasks"), problems)
    verifier = _verifier(raw.get("verifier"))
    if verifier is not None and isinstance(template, str):
        problems.guard("verifier", lambda: _check_verifier(verifier, template, tools, problems))
    if isinstance(template, str) and template in TEMPLATES:
        problems.guard(
            "tasks", lambda: _check_tasks(tasks, template, config, verifier, raw, problems)
        )
    return list(dict.fromkeys(problems))  # same problem found twice is listed once


# ---------------------------------------------------------------- helpers

_JSON_SCALARS = (str, int, float, bool, type(None))


def _non_json(value: Any, where: str, limit: int = 5) -> list[str]:
    """Paths holding values JSON cannot carry (specs travel as JSON to services and stores)."""
    found: list[str] = []
    stack: list[tuple[Any, list[Any]]] = [(value, [where])]
    while stack and len(found) < limit:
        node, segs = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, str):
                    found.append(f"{format_path(segs)}: key {k!r} is not a string")
                    continue
                if "\x00" in k:
                    # Postgres text and jsonb cannot hold NUL: the spec could not be stored.
                    found.append(f"{format_path(segs)}: key {k!r} contains a NUL character")
                    continue
                stack.append((v, [*segs, k]))
        elif isinstance(node, list | tuple):
            stack.extend((v, [*segs, i]) for i, v in enumerate(node))
        elif isinstance(node, str) and "\x00" in node:
            found.append(f"{format_path(segs)}: contains a NUL character")
        elif hasattr(node, "model_dump"):
            continue  # pydantic models (Task, specs) are dumped to JSON by the SDK
        elif not isinstance(node, _JSON_SCALARS):
            kind = type(node).__name__
            found.append(f"{format_path(segs)}: {kind} is not JSON (use str, number, list, dict)")
    return found


def _placeholder_problems(value: Any, where: str, params: set[str] | None) -> list[str]:
    problems = []
    for expr in placeholder_refs(value):
        try:
            segments = parse_path(expr)
        except PathError as exc:
            problems.append(f"{where}: bad placeholder ${{{expr}}}: {exc}")
            continue
        root = segments[0]
        if root not in CONTEXT_ROOTS:
            problems.append(
                f"{where}: placeholder ${{{expr}}} must start with one of {', '.join(CONTEXT_ROOTS)}"
            )
        elif root == "args" and len(segments) < 2:
            problems.append(f"{where}: placeholder ${{{expr}}} names no argument")
        elif root == "args" and params is not None and segments[1] not in params:
            problems.append(
                f"{where}: ${{{expr}}} uses argument {segments[1]!r}, "
                f"which paramsSchema does not declare"
            )
    return problems


def _declared_params(schema: dict[str, Any] | None) -> set[str] | None:
    if schema is None:
        return None
    if is_json_schema(schema):
        return set(schema["properties"])
    return set(schema)


def _static_prefix(template: str) -> str:
    """The complete path segments before the first placeholder of a templated path."""
    idx = template.find("${")
    if idx < 0:
        return template
    head = template[:idx]
    if head.endswith(".") or head.endswith("["):
        return head[:-1]
    cut = max(head.rfind("."), head.rfind("["))
    return head[:cut] if cut > 0 else ""


def _missing_in(root: dict[str, Any], path: str, noun: str) -> str | None:
    """None when path resolves in root, else a message naming what is missing."""
    try:
        segments = parse_path(path)
    except PathError as exc:
        return str(exc)
    if segments and isinstance(segments[0], str) and segments[0] not in root:
        known = ", ".join(map(repr, root)) or "none"
        return f"no {noun} {segments[0]!r} (known: {known})"
    try:
        resolve_path(root, segments)
    except PathError as exc:
        return f"{format_path(segments)}: {exc}"
    return None


def _check_schema(schema: Any, where: str, out: list[str]) -> None:
    for sub, msg in schema_problems(schema):
        out.append(f"{where}.paramsSchema{'.' + sub if sub else ''}: {msg}")


def _duplicates(names: list[str], where: Callable[[int], str], what: str, out: list[str]) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            out.append(f"{where(i)}: duplicate {what} {name!r}")
        seen.add(name)


# ---------------------------------------------------------------- per-template config checks


def _check_workflow(config: WorkflowConfig, out: list[str]) -> None:
    _duplicates([t.name for t in config.tools], lambda i: f"config.tools[{i}].name", "tool", out)
    for i, tool in enumerate(config.tools):
        where = f"config.tools[{i}]"
        _check_schema(tool.params_schema, where, out)
        params = _declared_params(tool.params_schema)
        for field, value in (
            ("fixturePath", tool.fixture_path),
            ("value", tool.value),
            ("response", tool.response),
        ):
            out.extend(_placeholder_problems(value, f"{where}.{field}", params))
        if tool.fixture_path:
            prefix = _static_prefix(tool.fixture_path)
            if prefix:
                missing = _missing_in(config.fixtures, prefix, "fixture")
                if missing:
                    out.append(f"{where}.fixturePath: {missing}")
        if tool.from_array:
            source: Any = None
            for root in (config.fixtures, config.initial_mutable_state):
                try:
                    source = resolve_path(root, tool.from_array)
                    break
                except PathError:
                    continue
            if source is None:
                known = ", ".join(map(repr, config.fixtures)) or "none"
                out.append(f"{where}.fromArray: no fixture {tool.from_array!r} (known: {known})")
            elif not isinstance(source, list | dict):
                out.append(f"{where}.fromArray: {tool.from_array!r} is not an array")
            elif tool.match_field:
                items = list(source.values()) if isinstance(source, dict) else source
                if items and not any(
                    isinstance(it, dict) and tool.match_field in it for it in items
                ):
                    out.append(
                        f"{where}.matchField: no {tool.from_array} entry has field "
                        f"{tool.match_field!r}"
                    )
            if tool.match_field and params is not None:
                arg = tool.match_arg or tool.match_field
                if arg not in params:
                    out.append(f"{where}.paramsSchema: missing argument {arg!r} used by matchField")
        if tool.kind == "action" and tool.target:
            field = "appendTo" if tool.append_to else "stateArray"
            try:
                current = resolve_path(config.initial_mutable_state, tool.target)
            except PathError:
                current = None
            if current is not None and not isinstance(current, list):
                out.append(
                    f"{where}.{field}: initialMutableState.{tool.target} is "
                    f"{type(current).__name__}, not an array"
                )
            try:
                parse_path(tool.target)
            except PathError as exc:
                out.append(f"{where}.{field}: {exc}")


def _check_custom(config: CustomConfig, out: list[str]) -> None:
    _duplicates([t.name for t in config.tools], lambda i: f"config.tools[{i}].name", "tool", out)
    for i, tool in enumerate(config.tools):
        where = f"config.tools[{i}]"
        _check_schema(tool.params_schema, where, out)
        params = _declared_params(tool.params_schema)
        out.extend(_placeholder_problems(tool.response, f"{where}.response", params))
        for j, m in enumerate(tool.mutates):
            mw = f"{where}.mutates[{j}]"
            out.extend(_placeholder_problems(m.path, f"{mw}.path", params))
            out.extend(_placeholder_problems(m.value, f"{mw}.value", params))
            try:
                parse_path(re.sub(r"\$\{[^{}]*\}", "x", m.path))
            except PathError as exc:
                out.append(f"{mw}.path: {exc}")


def _check_sql(config: SqlConfig, out: list[str]) -> None:
    # The same authorizer and time limit as the runtime: a schema or seed that ATTACHes a file
    # or loads an extension is refused here, with its config path.
    from rollout.shared.envs.templates.sql import SqlConfigError, open_database

    try:
        open_database(config).close()
    except SqlConfigError as exc:
        out.append(str(exc))


def _check_code_editing(config: CodeEditingConfig, out: list[str]) -> None:
    for path in config.files:
        try:
            check_file_path(path)
        except ToolError as exc:
            out.append(f'config.files["{path}"]: {exc}')
    cmd = config.test_command
    if isinstance(cmd, list) and not cmd or isinstance(cmd, str) and not cmd.strip():
        out.append("config.testCommand: empty command")


def _check_browser(config: BrowserConfig, out: list[str]) -> None:
    urls = [p.url for p in config.pages]
    _duplicates(urls, lambda i: f"config.pages[{i}].url", "page", out)
    known = set(urls)
    if config.initial_url is not None and config.initial_url not in known:
        out.append(f"config.initialUrl: no page {config.initial_url!r}")
    for i, page in enumerate(config.pages):
        ids = [e.id for e in page.elements]
        _duplicates(ids, lambda j, i=i: f"config.pages[{i}].elements[{j}].id", "element id", out)
        forms = {e.id for e in page.elements if e.type == "form"}
        for j, el in enumerate(page.elements):
            where = f"config.pages[{i}].elements[{j}]"
            if el.href is not None and el.href not in known:
                out.append(f"{where}.href: no page {el.href!r}")
            if el.type == "link" and not el.href:
                out.append(f"{where}.href: a link needs an href")
            if el.form is not None and el.form not in forms:
                out.append(f"{where}.form: no form {el.form!r} on {page.url}")
            if el.action is not None and el.action not in known:
                out.append(f"{where}.action: no page {el.action!r}")


def _check_openenv(config: OpenEnvConfig, out: list[str]) -> None:
    # Plan time, not minute 47: the server must be an OpenEnv server that answers /schema.
    from rollout.shared.envs.templates.openenv import check_url, fetch_schema

    try:
        check_url(config.url)
        fetch_schema(config.url)
    except RolloutError as exc:
        out.append(f"config.url: {exc.message}")


def _check_verifiers(config: VerifiersConfig, out: list[str]) -> None:
    # Its code is loaded only in a plugin host (at load and scoring), never here.
    probe = PluginConfig(entrypoint=f"{config.taskset}:x", sources=config.sources)
    out.extend(p.replace("config.entrypoint", "config.taskset") for p in shadowing_problems(probe))


def _check_nemo_gym(config: NemoGymConfig, out: list[str]) -> None:
    # Plan time: the server must answer like a resources server (/seed_session and /verify).
    from rollout.shared.envs.templates.nemo_gym import fetch_openapi

    try:
        fetch_openapi(config.url)
    except RolloutError as exc:
        out.append(f"config.url: {exc.message}")
    if config.tools is not None:
        _duplicates(
            [t.name for t in config.tools], lambda i: f"config.tools[{i}].name", "tool", out
        )


_CONFIG_CHECKS: dict[str, Callable[[Any, list[str]], None]] = {
    "workflow": _check_workflow,
    "custom": _check_custom,
    "sql": _check_sql,
    "code-editing": _check_code_editing,
    "browser": _check_browser,
    "openenv": _check_openenv,
    "verifiers": _check_verifiers,
    "nemo_gym": _check_nemo_gym,
}


def _plugin_tools(config: PluginConfig, problems: _Problems) -> list[str] | None:
    # The plugin is imported only inside a sandboxed plugin host, never in this process.
    from rollout.shared.envs.plugin_host.client import HostFailed, ReplyError, default_pool

    refused = shadowing_problems(config)
    if refused:
        problems.extend(refused)
        return None
    try:
        host = lease_host(config)
        try:
            result = host.call("reset", {"options": dict(config.options), "probe": True})
        finally:
            default_pool().release(host)
    except PluginError as exc:
        problems.append(f"config.entrypoint: {exc}")
        return None
    except (HostFailed, ReplyError) as exc:
        problems.append(f"config.entrypoint: {exc}")
        return None
    except RolloutError as exc:  # no sandbox here: say so, never import it unsandboxed
        problems.append(f"config.entrypoint: the plugin host cannot start: {exc.message}")
        return None
    names = [t["name"] for t in result.get("tools") or []]
    _duplicates(names, lambda i: f"config.entrypoint: tools()[{i}].name", "tool", problems)
    return names


# ---------------------------------------------------------------- tasks and verifier


def _tasks(raw_tasks: Any, problems: _Problems) -> list[tuple[int, TaskSpec]]:
    if raw_tasks is None or raw_tasks == []:
        problems.append("tasks: no tasks (add at least one Task)")
        return []
    if not isinstance(raw_tasks, list):
        return []
    parsed = []
    for i, raw in enumerate(raw_tasks):
        try:
            parsed.append((i, TaskSpec.model_validate(raw)))
        except ValidationError:
            continue  # already reported by the whole-spec validation
    return parsed


def _verifier(raw: Any) -> VerifierSpec | None:
    if raw is None:
        return None
    try:
        return VerifierSpec.model_validate(raw)
    except ValidationError:
        return None  # already reported by the whole-spec validation


def _check_verifier(
    verifier: VerifierSpec, template: str, tools: list[str] | None, out: list[str]
) -> None:
    if not verifier.primitives:
        out.append("verifier.primitives: empty (remove the verifier to use the default)")
        return
    _duplicates(
        [p.name for p in verifier.primitives],
        lambda i: f"verifier.primitives[{i}].name",
        "primitive name",
        out,
    )
    if all(p.weight == 0 for p in verifier.primitives):
        out.append("verifier.primitives: every weight is 0")
    for i, prim in enumerate(verifier.primitives):
        where = f"verifier.primitives[{i}]"
        definition = REGISTRY.get(prim.type)
        if definition is None:
            out.append(
                f"{where}.type: unknown primitive {prim.type!r} (known: {', '.join(known_types())})"
            )
            continue
        if definition.templates and template not in definition.templates:
            out.append(
                f"{where}.type: {prim.type} works with the {'/'.join(definition.templates)} "
                f"template, not {template}"
            )
        try:
            params = definition.params.model_validate(prim.params)
        except ValidationError as exc:
            out.extend(pydantic_problems(exc, where))
            continue
        if definition.check is not None:
            out.extend(f"{where}.{key}: {problem}" for key, problem in definition.check(params))
        if tools is None:
            continue
        for field in definition.tool_fields:
            value = getattr(params, field)
            names = [value] if isinstance(value, str) else list(value or [])
            key = definition.params.model_fields[field].alias or field
            for name in names:
                if name not in tools:
                    known = ", ".join(tools) or "none"
                    out.append(f"{where}.{key}: unknown tool {name!r} (tools: {known})")


def _state_roots(template: str, config: Any) -> set[str] | None:
    """Top-level keys the final state can have, when knowable statically."""
    if isinstance(config, WorkflowConfig):
        roots = set(config.initial_mutable_state)
        for tool in config.tools:
            if tool.target:
                with _quiet():
                    first = parse_path(tool.target)[0]
                    if isinstance(first, str):
                        roots.add(first)
        return roots
    if isinstance(config, CustomConfig):
        roots = set(config.initial_mutable_state)
        for tool in config.tools:
            for m in tool.mutates:
                with _quiet():
                    first = parse_path(re.sub(r"\$\{[^{}]*\}", "x", m.path))[0]
                    if isinstance(first, str):
                        roots.add(first)
        return roots
    if template == "browser":
        return set(BROWSER_STATE)
    return None


class _quiet:
    """Context manager ignoring path parse errors (they are reported elsewhere)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, *_: Any) -> bool:
        return exc_type is not None and issubclass(exc_type, PathError | IndexError)


def _check_tasks(
    tasks: list[tuple[int, TaskSpec]],
    template: str,
    config: Any,
    verifier: VerifierSpec | None,
    raw: dict[str, Any],
    out: list[str],
) -> None:
    ids = [(i, t.id) for i, t in tasks if t.id]
    _duplicates([tid for _, tid in ids], lambda k: f"tasks[{ids[k][0]}].id", "task id", out)
    roots = _state_roots(template, config)
    for i, task in tasks:
        where = f"tasks[{i}]"
        if not task.instruction.strip():
            out.append(f"{where}.instruction: empty")
        gt = task.hidden_ground_truth
        if verifier is None or not verifier.primitives:
            slim = EnvironmentSpec.model_construct(template=template, slug=str(raw.get("slug")))
            prims = default_verifier(slim, task).primitives
            if prims[0].type in ("env_reward", "verifiers_rubric"):
                continue  # the remote environment rewards the episode: no ground truth needed
            if gt is None:
                out.append(
                    f"{where}.hiddenGroundTruth: missing; the default verifier "
                    f"({prims[0].type}) compares against it"
                )
                continue
            if prims[0].type == "state_match" and len(prims) == 1:
                if not isinstance(gt, dict):
                    out.append(
                        f"{where}.hiddenGroundTruth: must be an object of state paths for the "
                        f"default state_match verifier"
                    )
                elif roots is not None:
                    for key in gt:
                        first = _first_segment(key)
                        if first is not None and first not in roots:
                            known = ", ".join(sorted(roots)) or "none"
                            out.append(
                                f"{where}.hiddenGroundTruth.{key}: not in the environment's "
                                f"state (state keys: {known})"
                            )
        if isinstance(config, SqlConfig) and isinstance(gt, dict):
            query = gt.get("query")
            if query is not None:
                _check_reference_query(config, query, f"{where}.hiddenGroundTruth.query", out)
        if isinstance(config, CodeEditingConfig) and isinstance(task.input, dict):
            _check_files(task.input.get("files"), f"{where}.input.files", out)
        if isinstance(config, CodeEditingConfig) and isinstance(gt, dict):
            for key in ("files", "tests"):
                files = gt.get(key)
                if files is None:
                    continue
                if not isinstance(files, dict) or not all(
                    isinstance(v, str) for v in files.values()
                ):
                    out.append(f"{where}.hiddenGroundTruth.{key}: must map paths to file contents")
                    continue
                for path in files:
                    try:
                        check_file_path(path)
                    except ToolError as exc:
                        out.append(f'{where}.hiddenGroundTruth.{key}["{path}"]: {exc}')


def _check_files(files: Any, where: str, out: list[str]) -> None:
    if files is None:
        return
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        out.append(f"{where}: must map paths to file contents")
        return
    for path in files:
        try:
            check_file_path(path)
        except ToolError as exc:
            out.append(f'{where}["{path}"]: {exc}')


def _first_segment(key: Any) -> str | None:
    if not isinstance(key, str):
        return None
    try:
        first = parse_path(key)[0]
    except PathError:
        return key
    return first if isinstance(first, str) else None


def _check_reference_query(config: SqlConfig, query: Any, where: str, out: list[str]) -> None:
    if not isinstance(query, str) or not query.strip():
        out.append(f"{where}: must be a non-empty SQL string")
        return
    from rollout.shared.envs.templates.sql import SqlConfigError, open_database, run_query

    try:
        conn = open_database(config)
    except SqlConfigError:
        try:  # a broken seed is reported on its own; the query can still be checked
            conn = open_database(config.model_copy(update={"seed": ""}))
        except SqlConfigError:
            return  # reported under config.schema
    try:
        run_query(conn, query, config.query_timeout_seconds * 5, 1)
    except ToolError as exc:
        out.append(f"{where}: {exc}")
    finally:
        conn.close()


def check_or_raise(env_or_spec: Any) -> EnvironmentSpec:
    """Validate and return the spec; RolloutError listing every problem otherwise."""
    problems = validate_environment(env_or_spec)
    if problems:
        raw = raw_environment(env_or_spec)
        slug = raw.get("slug") if isinstance(raw, dict) else None
        raise RolloutError(
            f"environment {slug!r} has {len(problems)} problem(s)", problems=problems
        )
    from rollout.shared.envs.coerce import as_spec

    return as_spec(env_or_spec)
