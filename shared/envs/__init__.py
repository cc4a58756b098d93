"""Environment engine: specs, template runtimes, verifier primitives, validation, sandbox.

Entry points for the agent loop and the services:

- `build_runtime(spec, task) -> EnvRuntime`: one episode (tools in, state out).
- `await score(spec, task, trajectory) -> VerifierResult`: async, since `tests_pass` runs the
  task's tests in the bubblewrap sandbox.
- `validate_environment(env) -> list[str]`: every problem, each naming its config path.
- `load_environments(path) -> list[Environment]`: the Environments a user's .py file defines.
"""

from rollout.shared.envs.engine import build_runtime, run_tool_script, score
from rollout.shared.envs.loader import load_environments, select_environment
from rollout.shared.envs.runtime import EnvRuntime, ToolResult, ToolSpec
from rollout.shared.envs.validation import check_or_raise, validate_environment
from rollout.shared.envs.verifiers import default_verifier, known_types

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
