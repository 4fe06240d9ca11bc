"""Where the time of a compiled train step goes on CPU: XLA's own per-op trace of the trainer's step.

  python benchmarks/profile_step.py [--preset small] [--layers 8] [--batch 8] [--seq 256]
      [--moe_backend tiled] [--xent_chunk 0] [--steps 3] [--top 25] [--vocab N] [--out NAME]
  python benchmarks/profile_step.py --preset demo --layers 4 --vocab 2048 --batch 4 --seq 2048 \
      --steps 2 --out profile_step_demo      # the CPT step of `make reproduce`

The step is the one `benchmarks/train_step.py` times (`steps.compile_xent_step`, AdamW with
clipping, fp32, full rows). XLA's CPU runtime emits one trace event per executed HLO op
(thunk) when `--xla_cpu_enable_xprof_traceme=true` is in XLA_FLAGS, which this script sets
before JAX starts; the events of `--steps` traced steps are read back from the profiler's XSpace
(`jax.profiler.ProfileData`) and summed per op. Ops are grouped by kind (fusion, dot,
gather/scatter, copy/transpose, ...) from the op name and what its fused computation holds
(a YNNPACK fusion around a dot counts as a matmul), and the table shows the top ops by total
time, the matmuls grouped by output shape, and each kind's share of the traced time. The per-op events add their own overhead, so the
traced step is slower than an untraced one (both are printed). Writes
benchmarks/results/profile_step.json.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import sys
import tempfile
import time


TRACE_FLAG = "--xla_cpu_enable_xprof_traceme=true"
KINDS = [("dot / matmul", r"^(dot|.*matmul|.*gemm)"),
         ("gather", r"gather"), ("scatter", r"scatter"),
         ("copy / transpose", r"^(copy|transpose|bitcast|reshape|dynamic-update-slice|"
                              r"dynamic-slice|slice|concatenate|pad)"),
         ("sort", r"sort"), ("all-reduce / collectives", r"(all-reduce|all-to-all|all-gather|"
                                                         r"reduce-scatter|collective)"),
         ("reduce", r"^reduce"), ("elementwise fusion", r"fusion"),
         ("while / conditional / call", r"^(while|conditional|call)")]


def kind_of(name: str, what: str = "") -> str:
  """The op's kind from its name, or from what its fused computation holds (`describe`)."""
  if re.search(r"[; ,]dot\b|\bdot$", what):
    return "dot / matmul"
  n = name.lower()
  for kind, pat in KINDS:
    if re.search(pat, n):
      return kind
  return "other"


def describe(hlo: str, name: str) -> str:
  """The op's output shape and the distinct opcodes of the computation it calls, from the
  compiled module's text (empty when the name is not an instruction there)."""
  m = re.search(r"^\s*(?:ROOT )?%?" + re.escape(name) + r" = (\S+) ([\w-]+)\((.*)$", hlo, re.M)
  if not m:
    return ""
  shape, opcode, rest = m.groups()
  out = f"{shape.split('{')[0]} {opcode}"
  called = re.search(r"calls=%?([\w.-]+)", rest)
  if called:
    body = re.search(r"^%?" + re.escape(called.group(1)) + r" .*?\{\n(.*?)\n\}", hlo, re.M | re.S)
    if body:
      ops = re.findall(r"= \S+ ([\w-]+)\(", body.group(1))
      seen = [o for i, o in enumerate(ops) if o not in ops[:i] and o != "parameter"]
      out += "; " + ",".join(seen[:8])
  return out


def trace_ops(run, steps: int) -> tuple[dict[str, list[float]], float]:
  """Runs `run` `steps` times under the profiler; returns ({op name: [ms, calls] summed over the
  runs}, seconds per run traced). Needs TRACE_FLAG in XLA_FLAGS before JAX starts."""
  import jax
  with tempfile.TemporaryDirectory() as d:
    t0 = time.perf_counter()
    with jax.profiler.trace(d):
      for _ in range(steps):
        run()
    traced = (time.perf_counter() - t0) / steps
    files = [os.path.join(r, f) for r, _, fs in os.walk(d) for f in fs if f.endswith(".xplane.pb")]
    if not files:
      sys.exit("error: the profiler wrote no .xplane.pb file")
    prof = jax.profiler.ProfileData.from_file(files[0])
  per_op: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
  for plane in prof.planes:
    if not plane.name.startswith("/host:CPU"):
      continue
    for line in plane.lines:
      for ev in line.events:
        name = ev.name
        # the runtime's own spans, not HLO ops
        if name.startswith(("PjitFunction", "PjRt", "ThunkExecutor", "Execute", "$")) or \
            " " in name or "::" in name:
          continue
        per_op[name][0] += ev.duration_ns / 1e6
        per_op[name][1] += 1
  if not per_op:
    sys.exit("error: no per-op events in the trace (is --xla_cpu_enable_xprof_traceme honoured "
             "by this jaxlib?)")
  return dict(per_op), traced


@dataclasses.dataclass
class OpSummary:
  """Traced op time per step: the top ops, matmuls by output shape, and each kind's share."""
  total: float                       # ms summed over every op and step
  steps: int
  kinds: dict                        # kind -> ms
  by_shape: dict                     # matmul output shape -> [ms, calls]
  top: list                          # [(op name, [ms, calls])], slowest first
  what: dict                         # op name -> its HLO description

  def print_tables(self) -> None:
    from common import table
    n, total = self.steps, self.total
    rows = [{"op": op[:40], "kind": kind_of(op, self.what[op]), "ms/step": f"{ms / n:.1f}",
             "calls/step": f"{c / n:.0f}", "share": f"{100 * ms / total:.1f}%",
             "what (output; ops inside)": self.what[op]} for op, (ms, c) in self.top]
    print(table(rows, ["op", "kind", "ms/step", "calls/step", "share",
                       "what (output; ops inside)"]))
    srows = [{"matmul output": k, "ms/step": f"{ms / n:.1f}", "ops/step": f"{c / n:.0f}",
              "share": f"{100 * ms / total:.1f}%"}
             for k, (ms, c) in sorted(self.by_shape.items(), key=lambda kv: -kv[1][0])[:12]]
    print(table(srows, ["matmul output", "ms/step", "ops/step", "share"]))
    krows = [{"kind": k, "ms/step": f"{ms / n:.1f}", "share": f"{100 * ms / total:.1f}%"}
             for k, ms in sorted(self.kinds.items(), key=lambda kv: -kv[1])]
    print(table(krows, ["kind", "ms/step", "share"]))

  def results(self) -> dict:
    """The per-step figures both profilers write to their JSON."""
    n = self.steps
    return {
        "ops_ms_per_step_total": self.total / n,
        "kinds_ms_per_step": {k: ms / n for k, ms in self.kinds.items()},
        "matmuls_by_output_ms_per_step": {k: ms / n for k, (ms, _) in self.by_shape.items()},
        "top_ops": [{"op": op, "kind": kind_of(op, self.what[op]), "ms_per_step": ms / n,
                     "calls_per_step": c / n, "hlo": self.what[op]} for op, (ms, c) in self.top]}


def summarize(per_op: dict, what: dict, steps: int, top_n: int) -> OpSummary:
  """Sums `trace_ops`' events by kind and by matmul output shape; keeps the `top_n` slowest ops."""
  kinds: dict[str, float] = collections.Counter()
  by_shape: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
  for name, (ms, c) in per_op.items():
    kind = kind_of(name, what[name])
    kinds[kind] += ms
    if kind == "dot / matmul":
      by_shape[what[name].split(" ")[0]][0] += ms
      by_shape[what[name].split(" ")[0]][1] += c
  top = sorted(per_op.items(), key=lambda kv: -kv[1][0])[:top_n]
  return OpSummary(sum(v[0] for v in per_op.values()), steps, dict(kinds), dict(by_shape), top,
                   what)


def model_preset(name: str, overrides: dict):
  """A model preset by name, or the model of a training preset of configs/common.py (`demo` is
  the `tiny` model reshaped), with `overrides` on top."""
  from lwm_jax.model.config import PRESETS, get_preset
  if name in PRESETS:
    return get_preset(name, **overrides)
  from configs.common import PRESETS as TRAINING
  if name not in TRAINING:
    raise SystemExit(f"unknown preset '{name}' (model presets: {', '.join(sorted(PRESETS))}; "
                     f"training presets: {', '.join(sorted(TRAINING))})")
  base, over = TRAINING[name]
  return get_preset(base, **{**over.get("model", {}), **overrides})


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--preset", default="small",
                  help="a model preset, or a training preset of configs/common.py (e.g. demo)")
  ap.add_argument("--layers", type=int, default=8)
  ap.add_argument("--vocab", type=int, default=0, help="vocabulary size (0: the preset's)")
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=256)
  ap.add_argument("--moe_backend", default="tiled")
  ap.add_argument("--xent_chunk", type=int, default=0,
                  help="the chunked cross-entropy with this many columns (0: the plain loss)")
  ap.add_argument("--steps", type=int, default=3)
  ap.add_argument("--top", type=int, default=25)
  ap.add_argument("--out", default="profile_step")
  a = ap.parse_args()
  flags = os.environ.get("XLA_FLAGS", "")
  if TRACE_FLAG not in flags:
    os.environ["XLA_FLAGS"] = (flags + " " + TRACE_FLAG).strip()
  from common import write_result
  from train_step import our_runner
  from lwm_jax.train import optimizer, synthetic
  over = {"num_hidden_layers": a.layers}
  if a.vocab:
    over["vocab_size"] = a.vocab
  cfg = optimizer.apply_precision(model_preset(a.preset, over), "auto")
  cfg = cfg.replace(moe_backend=a.moe_backend)
  batch = synthetic.synthetic_batch(0, 0, a.batch, a.seq, cfg.vocab_size)
  batch["segment_ids"][:] = 1
  batch["loss_weights"][:] = 1
  run, _, _, _ = our_runner(cfg, batch, xent_chunk=a.xent_chunk)
  hlo = run.compiled_text()
  run()  # warm-up (compiles)
  run()
  t0 = time.perf_counter()
  for _ in range(a.steps):
    run()
  untraced = (time.perf_counter() - t0) / a.steps
  per_op, traced = trace_ops(run, a.steps)
  what = {name: describe(hlo, name) for name in per_op}
  summary = summarize(per_op, what, a.steps, a.top)
  print(f"{a.preset} ({a.layers} layers), batch {a.batch} x {a.seq}, moe_backend={a.moe_backend}: "
        f"step {untraced:.2f} s untraced, {traced:.2f} s traced; per-op events sum to "
        f"{summary.total / a.steps / 1e3:.2f} s per step (summed over threads)")
  summary.print_tables()
  write_result(a.out, {
      "preset": a.preset, "layers": a.layers, "batch": a.batch, "seq": a.seq,
      "moe_backend": a.moe_backend, "xent_chunk": a.xent_chunk, "steps": a.steps, "step_s_untraced": untraced,
      "step_s_traced": traced, **summary.results()})


if __name__ == "__main__":
  main()
