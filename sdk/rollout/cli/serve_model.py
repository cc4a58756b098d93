"""`rollout serve-model MODEL`: serve a local or trained policy as an OpenAI-compatible API."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from rollout.cli._common import client_settings_or_error
from rollout.services.inference.defaults import (
    DEFAULT_HOST,
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_N,
    DEFAULT_MAX_TOKENS_LIMIT,
    DEFAULT_PORT,
)
from rollout.shared.service.sockets import bind

EPILOG = """\
Endpoints: GET /v1/models, GET /v1/models/{id}, POST /v1/chat/completions (tools, n, seed,
logprobs, stream=true as server-sent events), GET /health. Any OpenAI client works:

  rollout serve-model local/tiny-agent --port 8400
  OpenAI(base_url="http://127.0.0.1:8400/v1", api_key="unused").chat.completions.create(
      model="local/tiny-agent", messages=[{"role": "user", "content": "hi"}])

and so does a run's actor: `rollout run ENV --model http://127.0.0.1:8400/v1#local/tiny-agent`.

A trained policy (BASE:SUFFIX or a job id) follows the stack's policy.updated events: each new
version is loaded beside the served one and takes over once ready (no request fails); /v1/models
and each answer's system_fingerprint name the version. It listens on 127.0.0.1 unless --host
says otherwise; any other address needs --api-key-env or --api-keys-file, and then every
request must send `Authorization: Bearer <key>`.
"""


def register(sub: argparse._SubParsersAction) -> None:
    """Add the `serve-model` verb."""
    p = sub.add_parser(
        "serve-model",
        help="serve a local or trained model as an OpenAI-compatible API",
        description="Serve MODEL (e.g. local/tiny-agent, hf:DIR, BASE:SUFFIX, a job id) as an "
        "OpenAI-compatible chat completions API.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL", help="the model name, as a run's --model takes it")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port ({DEFAULT_PORT}; 0: any)")
    p.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on ({DEFAULT_HOST}); a non-loopback one needs an API key",
    )
    p.add_argument(
        "--name",
        default=None,
        help="the model id clients send (default: MODEL itself)",
    )
    p.add_argument(
        "--api-key-env",
        metavar="VAR",
        default=None,
        help="require `Authorization: Bearer <key>` with the key held in environment variable VAR",
    )
    p.add_argument(
        "--api-keys-file",
        metavar="FILE",
        type=Path,
        default=None,
        help="require a Bearer key from FILE (one key per line, # comments)",
    )
    p.add_argument(
        "--no-follow",
        action="store_true",
        help="serve the loaded version only (do not follow policy.updated on the stack)",
    )
    p.add_argument(
        "--max-n",
        type=int,
        default=DEFAULT_MAX_N,
        help=f"most choices per request ({DEFAULT_MAX_N})",
    )
    p.add_argument(
        "--max-tokens-limit",
        type=int,
        default=DEFAULT_MAX_TOKENS_LIMIT,
        help=f"largest max_tokens a request may ask for ({DEFAULT_MAX_TOKENS_LIMIT})",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=DEFAULT_MAX_BATCH,
        help=f"most requests sampled together ({DEFAULT_MAX_BATCH})",
    )
    p.set_defaults(func=_serve_model)


def _serve_model(args: argparse.Namespace) -> int:
    from rollout.services.inference.exposure import check_exposure, load_keys
    from rollout.services.inference.main import serve_forever

    for flag, value, low in (("--port", args.port, 0), ("--max-n", args.max_n, 1),
                             ("--max-tokens-limit", args.max_tokens_limit, 1),
                             ("--max-batch", args.max_batch, 1)):  # fmt: skip
        if value < low or (flag == "--port" and value > 65535):
            print(f"error: {flag} {value} is out of range", file=sys.stderr)
            return 2
    keys = load_keys(args.api_key_env, args.api_keys_file)
    check_exposure(args.host, keys)  # before anything loads or listens
    sock = bind(args.host, args.port)

    def announce(running) -> None:  # noqa: ANN001
        version = running.policy.version
        shown = f" (policy version {version})" if version is not None else ""
        print(
            f"rollout serve-model: {running.config.model}{shown} at {running.base_url}", flush=True
        )
        print(f"  as an actor model: {running.actor_model}", flush=True)
        if keys is not None:
            print(f"  requests need 'Authorization: Bearer <key>' ({len(keys)} key(s))", flush=True)

    try:
        asyncio.run(
            serve_forever(
                args.model,
                sock,
                announce=announce,
                name=args.name,
                keys=keys,
                follow=None if args.no_follow else client_settings_or_error,
                max_batch=args.max_batch,
                max_n=args.max_n,
                max_tokens_limit=args.max_tokens_limit,
            )
        )
    except KeyboardInterrupt:
        return 0
    return 0
