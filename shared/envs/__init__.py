"""Environment engine: specs, template runtimes, verifier primitives, validation, sandbox.

Entry points for the agent loop and the services:

- `build_runtime(spec, task) -> EnvRuntime`: one episode (tools in, state out).
- `await score(spec, task, trajectory) -> VerifierResult`: async, since `tests_pass` runs the
  task's tests in the bubblewrap sandbox.
- `validate_environment(env) -> list[str]`: every problem, each naming its config path.
- `load_environments(path) -> list[Environment]`: the Environments a user's .py file defines.

Each name loads its module when first asked for: importing one submodule (the sandbox probe of
`rollout status`) does not load the whole engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rollout.shared.lazy import lazy_names

if TYPE_CHECKING:
    from rollout.shared.envs.engine import build_runtime, run_tool_script, score
    from rollout.shared.envs.loader import load_environments, select_environment
    from rollout.shared.envs.runtime import EnvRuntime, ToolResult, ToolSpec
    from rollout.shared.envs.validation import check_or_raise, validate_environment
    from rollout.shared.envs.verifiers import default_verifier, known_types

# Each public name -> the module that defines it.
_EXPORTS = {
    "EnvRuntime": "rollout.shared.envs.runtime",
    "ToolResult": "rollout.shared.envs.runtime",
    "ToolSpec": "rollout.shared.envs.runtime",
    "build_runtime": "rollout.shared.envs.engine",
    "check_or_raise": "rollout.shared.envs.validation",
    "default_verifier": "rollout.shared.envs.verifiers",
    "known_types": "rollout.shared.envs.verifiers",
    "load_environments": "rollout.shared.envs.loader",
    "run_tool_script": "rollout.shared.envs.engine",
    "score": "rollout.shared.envs.engine",
    "select_environment": "rollout.shared.envs.loader",
    "validate_environment": "rollout.shared.envs.validation",
}

__all__ = [
    "EnvRuntime",
    "ToolResult",
    "ToolSpec",
    "build_runtime",
    "check_or_raise",
    "default_verifier",
    "known_types",
    "load_environments",
    "run_tool_script",
    "score",
    "select_environment",
    "validate_environment",
]


__getattr__, __dir__ = lazy_names(__name__, _EXPORTS)
