"""Helpers shared by the benchmark scripts: a measured matmul peak, timing, result files."""
from __future__ import annotations

import json
import os
import pathlib
import platform
import statistics
import time
from typing import Any, Callable

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def matmul_peak_gflops(n: int = 2048, reps: int = 10) -> float:
  """fp32 matmul throughput that jax reaches on this machine (the MFU denominator)."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  f = jax.jit(lambda x: x @ x)
  f(a).block_until_ready()
  times = []
  for _ in range(reps):
    t = time.perf_counter()
    f(a).block_until_ready()
    times.append(time.perf_counter() - t)
  return 2 * n ** 3 / min(times) / 1e9


def median_time(fn: Callable[[], Any], steps: int, warmup: int = 1) -> float:
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(steps):
    t = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t)
  return statistics.median(times)


def machine() -> dict[str, Any]:
  return {"cpus": os.cpu_count(), "platform": platform.platform(),
          "python": platform.python_version(),
          "malloc_env": {k: os.environ.get(k) for k in ("MALLOC_MMAP_MAX_",
                                                        "MALLOC_TRIM_THRESHOLD_",
                                                        "MALLOC_ARENA_MAX")}}


def write_result(name: str, payload: dict[str, Any]) -> pathlib.Path:
  RESULTS.mkdir(parents=True, exist_ok=True)
  path = RESULTS / f"{name}.json"
  payload = dict(payload, machine=machine(), date=time.strftime("%Y-%m-%d %H:%M:%S"))
  path.write_text(json.dumps(payload, indent=2) + "\n")
  return path


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
  widths = [max(len(c), *(len(f"{r.get(c, '')}") for r in rows)) for c in cols]
  line = lambda vals: "| " + " | ".join(f"{v!s:>{w}}" for v, w in zip(vals, widths)) + " |"
  out = [line(cols), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
  out += [line([r.get(c, "") for c in cols]) for r in rows]
  return "\n".join(out)
