"""Interop with other agent-RL ecosystems: rollout backends, OpenEnv, verifiers, RULER, ART.

Adapters that run a user's module (a `rollout_func`, a verifiers `load_environment`) do it in
a plugin host (envs/plugin_host/), never in the calling process.
"""
