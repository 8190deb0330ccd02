#!/usr/bin/env bash
# Issue 44's GPU check: bench/bench_train_gpu.py with and without the fast kernels, under 8 minutes.
#
#   scripts/gpu_check.sh prepare      here (PyPI reachable): download the wheels the GPU machine lacks
#                                     into build/gpu-wheels (git-ignored; carry it to the machine)
#   scripts/gpu_check.sh [ARGS...]    on the GPU machine: install those wheels into a private folder,
#                                     then run the bench (ARGS go to it, e.g. --cpu-smoke, --kernels reference)
#
# The device has no package index: what is not carried cannot be installed. The wheels are the gpu
# extra's flash-linear-attention (Triton, pure Python) and the transformers this project pins, with
# the packages that transformers version needs newer than the device image's. causal-conv1d ships
# only as source on PyPI (its CUDA build takes minutes of nvcc), and flash-attn's wheels are not on
# PyPI: without them the short convolution runs on PyTorch and attention on sdpa, and the bench's
# table names what ran. When no wheel can be installed the bench runs the reference path only.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${GPU_CHECK_WHEELS:-build/gpu-wheels}
PYTHON=${PYTHON:-python3}

if [ "${1:-}" = prepare ]; then
  here=${RELEARN_PYTHON:-.venv/bin/python}
  version() { "$here" -c "import importlib.metadata as m; print(m.version('$1'))"; }
  mkdir -p "$WHEELS"
  pins=("transformers==$(version transformers)" "huggingface-hub==$(version huggingface_hub)" "kernels==$(version kernels)"
        "tomlkit==$(version tomlkit)" "flash-linear-attention==0.6.0" "fla-core==0.6.0")
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" "${pins[@]}" \
    || { echo "gpu_check prepare: pip download failed" >&2; exit 1; }
  ls -1 "$WHEELS"
  echo "carry $WHEELS to the GPU machine (device run: carry [\"$WHEELS\"], command scripts/gpu_check.sh)"
  exit 0
fi

SITE=/tmp/relearn-gpu-site
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl; then
    if PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c "import transformers.models.qwen3_5_moe" 2>/dev/null; then
      export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    else  # a carried package that does not import against the image's: run on the image's own
      echo "gpu_check: transformers from the carried wheels does not import here: the image's packages, reference path only" >&2
    fi
  else
    echo "gpu_check: the carried wheels did not install: the fast kernels cannot be used, the reference path only" >&2
  fi
else
  echo "gpu_check: no wheels in $WHEELS (run 'scripts/gpu_check.sh prepare' where PyPI is reachable, and carry it):" \
       "the fast kernels cannot be installed here, the reference path only" >&2
fi
for m in fla causal_conv1d flash_attn; do
  if "$PYTHON" -c "import $m" 2>/dev/null; then echo "gpu_check: $m importable"; else echo "gpu_check: $m not importable"; fi
done
out=${OUT:-build}
mkdir -p "$out"
# 480 s in all: the bench's own budget (420 s) stops a slow run before this does.
PYTHONUNBUFFERED=1 timeout 480 "$PYTHON" bench/bench_train_gpu.py --json "$out/gpu_check.json" "$@"
