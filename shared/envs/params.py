"""Tool parameter schemas: the seed's short form (`{"id": "string"}`) or full JSON Schema.

Short form: each key is an argument, each value a type name (`string`, `number`, `integer`,
`boolean`, `array`, `object`, `any`; a trailing `?` makes it optional) or a dict with `type`
and `description`. Arguments are checked before a tool runs, so a malformed call becomes a tool
error the model can read, never an exception.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollout.shared.envs.paths import quoted_path

TYPES = ("string", "number", "integer", "boolean", "array", "object", "any")


def is_json_schema(schema: dict[str, Any]) -> bool:
    """True when the schema is already a JSON Schema object (not the short form)."""
    return schema.get("type") == "object" and isinstance(schema.get("properties"), dict)


def schema_problems(schema: Any) -> list[tuple[str, str]]:
    """(sub-path, message) pairs for a paramsSchema that cannot be used."""
    if schema is None:
        return []
    if not isinstance(schema, dict):
        return [("", f"must be an object, got {type(schema).__name__}")]
    if is_json_schema(schema):
        problems = []
        for name, prop in schema["properties"].items():
            if not isinstance(prop, dict):
                problems.append((quoted_path(["properties", name]), "must be an object"))
            elif "type" in prop and _type_name(prop["type"]) is None:
                problems.append(
                    (quoted_path(["properties", name, "type"]), f"unknown type {prop['type']!r}")
                )
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            problems.append(("required", "must be a list of argument names"))
        return problems
    problems = []
    for name, spec in schema.items():
        type_name = spec.get("type", "any") if isinstance(spec, dict) else spec
        if isinstance(spec, dict) and not isinstance(spec.get("description", ""), str):
            problems.append((quoted_path([name, "description"]), "must be a string"))
        if _type_name(type_name) is None:
            allowed = ", ".join(TYPES)
            problems.append(
                (quoted_path([name]), f"unknown type {type_name!r} (use one of: {allowed})")
            )
    return problems


def _type_name(value: Any) -> str | None:
    if isinstance(value, list):  # JSON Schema unions like ["string", "null"]
        names = [_type_name(v) for v in value]
        return None if None in names else "any"
    if not isinstance(value, str):
        return None
    base = value[:-1] if value.endswith("?") else value
    if base == "null":
        return "any"
    return base if base in TYPES else None


def to_json_schema(schema: dict[str, Any] | None, inferred: list[str] | None = None) -> dict:
    """The JSON Schema offered to the model; with no schema, the inferred arg names, untyped."""
    if schema is None:
        props = {name: {"description": f"value for {name}"} for name in inferred or []}
        return {"type": "object", "properties": props, "required": list(props)}
    if is_json_schema(schema):
        return schema
    props: dict[str, Any] = {}
    required: list[str] = []
    for name, spec in schema.items():
        desc = ""
        type_name = spec
        if isinstance(spec, dict):
            type_name = spec.get("type", "any")
            desc = spec.get("description", "")
        optional = isinstance(type_name, str) and type_name.endswith("?")
        base = _type_name(type_name) or "any"
        prop: dict[str, Any] = {} if base == "any" else {"type": base}
        if desc:
            prop["description"] = desc
        props[name] = prop
        if not optional:
            required.append(name)
    return {"type": "object", "properties": props, "required": required}


def _matches(value: Any, type_name: str) -> bool:
    if type_name == "any":
        return True
    if type_name == "string":
        return isinstance(value, str)
    if type_name == "boolean":
        return isinstance(value, bool)
    if type_name == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if type_name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if type_name == "array":
        return isinstance(value, list)
    if type_name == "object":
        return isinstance(value, dict)
    return True


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def argument_errors(json_schema: dict[str, Any], arguments: dict[str, Any]) -> list[str]:
    """What is wrong with a call's arguments under the schema (empty when fine)."""
    errors = []
    props = json_schema.get("properties", {})
    for name in json_schema.get("required", []):
        if name not in arguments:
            errors.append(f"missing required argument {name!r}")
    for name, value in arguments.items():
        prop = props.get(name)
        if not isinstance(prop, dict) or "type" not in prop:
            continue
        type_name = _type_name(prop["type"]) or "any"
        if value is None and isinstance(prop["type"], list) and "null" in prop["type"]:
            continue
        if not _matches(value, type_name):
            errors.append(f"argument {name!r} must be {type_name}, got {_json_type(value)}")
    return errors


# _matches, one function per type (tests/envs/test_validation.py holds them to it).
_TYPE_CHECKS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: (
        (isinstance(v, int) and not isinstance(v, bool))
        or (isinstance(v, float) and v.is_integer())
    ),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}

# The exact types each check passes without asking it (subclasses and 2.0-as-integer do ask).
_EXACT: dict[str, frozenset[type]] = {
    "string": frozenset({str}),
    "boolean": frozenset({bool}),
    "integer": frozenset({int}),
    "number": frozenset({int, float}),
    "array": frozenset({list}),
    "object": frozenset({dict}),
}

_ABSENT = object()


def argument_checker(json_schema: dict[str, Any]) -> Callable[[dict[str, Any]], list[str]]:
    """argument_errors with the schema read once, for a tool that is called many times.

    The checker gives exactly argument_errors' problems; a schema it does not expect (say
    `properties` not an object) gets argument_errors itself, called each time.
    """
    props = json_schema.get("properties", {})
    required = json_schema.get("required", [])
    if not isinstance(props, dict) or not isinstance(required, list | tuple):
        return lambda arguments: argument_errors(json_schema, arguments)
    needed = tuple(required)
    try:
        all_needed = frozenset(needed)
    except TypeError:  # an unhashable name: argument_errors raises as it always did
        return lambda arguments: argument_errors(json_schema, arguments)
    # name -> (type name, its check, null allowed); untyped and `any` arguments need none.
    typed: dict[Any, tuple[str, Callable[[Any], bool], bool, frozenset[type]]] = {}
    for name, prop in props.items():
        if not isinstance(prop, dict) or "type" not in prop:
            continue
        type_name = _type_name(prop["type"]) or "any"
        if type_name != "any":
            nullable = isinstance(prop["type"], list) and "null" in prop["type"]
            typed[name] = (type_name, _TYPE_CHECKS[type_name], nullable, _EXACT[type_name])

    # The passing call's shortcut: each required argument there, every typed one of an exact
    # type. Anything else (a missing one, a subclass, 2.0 as an integer) takes `errors`.
    needed_typed = tuple((n, typed[n][3]) for n in dict.fromkeys(needed) if n in typed)
    needed_plain = tuple(n for n in dict.fromkeys(needed) if n not in typed)
    optional_typed = tuple((n, rule[3]) for n, rule in typed.items() if n not in all_needed)

    def check(arguments: dict[str, Any]) -> list[str]:
        if type(arguments) is not dict:
            return errors(arguments)
        for name in needed_plain:
            if name not in arguments:
                return errors(arguments)
        for name, exact in needed_typed:
            if type(arguments.get(name, _ABSENT)) not in exact:
                return errors(arguments)
        for name, exact in optional_typed:
            value = arguments.get(name, _ABSENT)
            if value is not _ABSENT and type(value) not in exact:
                return errors(arguments)
        return []

    def errors(arguments: dict[str, Any]) -> list[str]:
        if all_needed <= arguments.keys():
            problems = []
        else:
            problems = [f"missing required argument {n!r}" for n in needed if n not in arguments]
        if typed:
            for name, value in arguments.items():
                rule = typed.get(name)
                if rule is None or type(value) in rule[3]:
                    continue
                if (value is None and rule[2]) or rule[1](value):
                    continue
                problems.append(f"argument {name!r} must be {rule[0]}, got {_json_type(value)}")
        return problems

    return check
