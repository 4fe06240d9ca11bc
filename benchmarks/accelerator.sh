#!/usr/bin/env bash
# One prepared accelerator run (under 8 minutes on one GPU or TPU host): bf16 train-step MFU of the
# ~1B-active `moe_1b` preset with ragged_dot dispatch on the expert-parallel mesh, then decode
# tokens/s at batch 1, 8 and 64. On a CPU-only machine it prints "no accelerator" and exits 0.
#
#   bash benchmarks/accelerator.sh            # uses .venv/bin/python, else python3
#   PYTHON=/path/to/python bash benchmarks/accelerator.sh [extra flags for accelerator.py]
#
# The JAX install must match the accelerator (e.g. `pip install -U "jax[cuda12]"` or
# `"jax[tpu]"`); results go to benchmarks/results/accelerator.json.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# glibc allocator settings of the Makefile (they matter on CPU hosts too).
export MALLOC_MMAP_MAX_="${MALLOC_MMAP_MAX_:-0}" MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-1}"
export MALLOC_TRIM_THRESHOLD_="${MALLOC_TRIM_THRESHOLD_:-17179869184}"
# Leave room for the decode model beside the train step's buffers.
export XLA_PYTHON_CLIENT_MEM_FRACTION="${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}"

if ! backend="$("$PY" -c 'import jax; print(jax.default_backend())' 2>/dev/null | tail -n 1)"; then
  echo "accelerator.sh: $PY cannot import jax (make test sets up .venv; or set PYTHON)" >&2
  exit 1
fi
if [ "$backend" = "cpu" ]; then
  echo "no accelerator (JAX backend: $backend); nothing measured"
  exit 0
fi
# 450 s leaves the 8-minute budget some slack; the script prints as it goes.
exec timeout 450 "$PY" benchmarks/accelerator.py "$@"
