"""Training metrics: FLOPs per token and MFU, peak figures, metrics.jsonl + TensorBoard, loss plot.

metrics.jsonl holds one JSON row per logged step and split. A resumed run replays the steps after
its checkpoint; `drop_rows_after` removes the rows a killed run wrote for those steps first, so
every (step, split) appears once.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from lwm_jax.data.jsonl import iter_jsonl
from lwm_jax.model import sizes
from lwm_jax.model.config import ModelConfig

# Dense bf16 peak FLOP/s per chip (vendor figures) for MFU on accelerators.
PEAK_FLOPS = {
    "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12,
    "TPU v5": 459e12, "TPU v6 lite": 918e12, "TPU v6e": 918e12,
    "NVIDIA A100": 312e12, "NVIDIA H100": 989e12, "NVIDIA H200": 989e12, "NVIDIA B200": 2250e12,
}


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  """Training FLOPs per token, the one formula of `lwm_jax.model.sizes` (active parameters from
  the abstract model, full attention over the sequence, linear attention's state update)."""
  return sizes.count(cfg).train_flops_per_token(cfg, seq_len)


def measure_matmul_peak(n: int = 1024, repeats: int = 5) -> float:
  """Best observed fp32 matmul FLOP/s on the default device (the CPU reference peak)."""
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, a).block_until_ready()
  best = float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    f(a, a).block_until_ready()
    best = min(best, time.perf_counter() - t)
  return 2.0 * n ** 3 / best


def peak_flops_per_device(measure_cpu: bool = True) -> tuple[float, str]:
  """(peak FLOP/s of one device, where the figure came from)."""
  dev = jax.devices()[0]
  kind = getattr(dev, "device_kind", "")
  for name, f in PEAK_FLOPS.items():
    if kind.startswith(name):
      return f, f"table ({kind})"
  if dev.platform == "cpu" and measure_cpu:
    return measure_matmul_peak(), "measured fp32 matmul"
  return float("nan"), f"unknown device kind '{kind}'"


def _summary_writer_class():
  """tensorboardX's SummaryWriter, imported without PyTorch.

  tensorboardX imports torch whenever it is installed (2-8 s) only to accept torch tensors; we
  write Python floats, so a torch that no one has imported yet is hidden during the import. A
  process that imported torch itself is left as it is."""
  if "torch" in sys.modules:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
    return SummaryWriter
  sys.modules["torch"] = None  # `import torch` raises ImportError while this is set
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
  finally:
    del sys.modules["torch"]
  return SummaryWriter


class MetricsWriter:
  """Appends scalars to <workdir>/metrics.jsonl and TensorBoard event files (primary process only)."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    self.path = os.path.join(workdir, "metrics.jsonl")
    self._tb = None
    if enabled:
      self._tb = _summary_writer_class()(os.path.join(workdir, "tensorboard"))

  def write(self, step: int, scalars: dict[str, Any], prefix: str = "train") -> None:
    if not self.enabled:
      return
    row: dict[str, Any] = {"step": int(step), "split": prefix}
    for k, v in scalars.items():
      a = np.asarray(v)
      if a.ndim == 0:
        row[k] = float(a)
        self._tb.add_scalar(f"{prefix}/{k}", float(a), step)
      elif k == "expert_load" and a.size:
        for layer, load in enumerate(a):
          for e, x in enumerate(load):
            self._tb.add_scalar(f"{prefix}/expert_load/layer{layer}/e{e}", float(x), step)
        row[k] = np.round(a, 5).tolist()
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def drop_rows_after(path: str, step: int) -> int:
  """Removes the rows of `path` (metrics.jsonl) whose step is past `step`, atomically; returns how
  many went. An unreadable final line without a newline is a row torn by a kill and goes too; any
  other line that is not a JSON row with a step is an error naming file and line."""
  if not os.path.exists(path):
    return 0
  with open(path, encoding="utf-8") as f:
    lines = f.readlines()
  keep, dropped = [], 0
  for i, line in enumerate(lines, 1):
    try:
      row_step = int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError) as e:
      if i == len(lines) and not line.endswith("\n"):
        dropped += 1
        continue
      raise ValueError(f"{path}:{i}: not a metrics row ({e}); move the file aside to resume") from e
    if row_step > step:
      dropped += 1
    else:
      keep.append(line if line.endswith("\n") else line + "\n")
  if keep != lines:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
      f.writelines(keep)
    os.replace(tmp, path)
  return dropped


def plot_losses(workdir: str) -> str | None:
  """loss.png from metrics.jsonl (train and validation loss against step)."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return None
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  series: dict[str, list[tuple[int, float]]] = {}
  for _, row in iter_jsonl(path):
    if "loss" in row:
      series.setdefault(row["split"], []).append((row["step"], row["loss"]))
  if not series:
    return None
  fig, ax = plt.subplots(figsize=(6, 4))
  for split, pts in series.items():
    xs, ys = zip(*pts)
    ax.plot(xs, ys, label=split, marker="o" if split != "train" else None)
  ax.set_xlabel("step")
  ax.set_ylabel("loss")
  ax.legend()
  ax.grid(alpha=0.3)
  out = os.path.join(workdir, "loss.png")
  fig.tight_layout()
  fig.savefig(out, dpi=100)
  plt.close(fig)
  return out


def plot_rewards(workdir: str) -> str | None:
  """reward.png from an RL run's metrics.jsonl: the rollouts' mean reward (and its components)
  per step, and the greedy held-out reward when the run evaluates."""
  path = os.path.join(workdir, "metrics.jsonl")
  if not os.path.exists(path):
    return None
  train: dict[str, list[tuple[int, float]]] = {}
  held: list[tuple[int, float]] = []
  for _, row in iter_jsonl(path):
    if row.get("split") == "train":
      for k, v in row.items():
        if k.startswith("rollout/reward_") and k not in ("rollout/reward_std",
                                                          "rollout/reward_s"):
          train.setdefault(k.split("/", 1)[1], []).append((row["step"], v))
    elif row.get("split") == "eval" and "reward_mean" in row:
      held.append((row["step"], row["reward_mean"]))
  if not train and not held:
    return None
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(6.5, 4))
  for name, pts in sorted(train.items()):
    xs, ys = zip(*pts)
    ax.plot(xs, ys, label=f"rollouts {name}", lw=2 if name == "reward_mean" else 1,
            alpha=1.0 if name == "reward_mean" else 0.6)
  if held:
    xs, ys = zip(*held)
    ax.plot(xs, ys, label="held-out reward (greedy)", marker="o", color="black")
  ax.set_xlabel("step")
  ax.set_ylabel("reward (0-25)")
  ax.legend(fontsize=8)
  ax.grid(alpha=0.3)
  out = os.path.join(workdir, "reward.png")
  fig.tight_layout()
  fig.savefig(out, dpi=100)
  plt.close(fig)
  return out
