#!/usr/bin/env bash
# Rehearse the lent GPU machine's run here, on the CPU, before spending device time on it:
# a venv like the device image's (the versions ../.library/device/KINDS.md lists: transformers
# 5.17.0, accelerate 1.15.0, huggingface_hub 1.33.0, ...; torch is this machine's CPU build),
# the wheels of benchmarks/gpu_wheels.sh for this Python, a copy of the tree as the device tool
# sends it (tracked and untracked-not-ignored files plus the two carried folders), then the
# device's own script, benchmarks/gpu_device.sh, with a small measurement and the device tests
# on the CPU. A missing wheel or an API the image's versions lack shows up here.
#
#   PYTHON=.venv/bin/python bash benchmarks/gpu_rehearsal.sh
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
work=${REHEARSAL_DIR:-/tmp/rollout-gpu-rehearsal}
venv=$work/venv
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.13.0
  # The image's packages this project touches, at the image's versions where KINDS.md gives
  # them; nothing the image lacks (that must come from the carried wheels).
  "$venv/bin/pip" install -q -c <(echo torch==2.13.0) transformers==5.17.0 accelerate==1.15.0 \
    huggingface_hub==1.33.0 tokenizers==0.23.2 safetensors==0.8.0 peft pytest pytest-xdist \
    pytest-timeout pytest-mock hypothesis httpx jinja2 pyyaml typer rich click psutil pyarrow \
    pandas fsspec xxhash numpy requests aiohttp packaging setuptools wheel uvloop tqdm
fi
pyver=$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
PYTHON=$python GPU_PYTHON_VERSION=$pyver bash benchmarks/gpu_wheels.sh
rm -rf "$work/tree" "$work/site" && mkdir -p "$work/tree/.cache"
git ls-files -co --exclude-standard -z | tar --null -cf - -T - | tar -xf - -C "$work/tree"
cp -r .cache/gpu-wheels .cache/gpu-tokenizer "$work/tree/.cache/"
echo "tree as sent: $(du -sh "$work/tree" | cut -f1)"
cd "$work/tree"
PYTHON=$venv/bin/python GPU_SITE=$work/site bash benchmarks/gpu_device.sh --test-device cpu \
  --batch 4 --new-tokens 8 --repeats 1 --sft-steps 1 --budget-s 1800 "$@"
