"""Ahead-of-time compilation of the trainer's and the sampler's steps for a TPU topology, on any host.

`compile_stage(config, stage, topology)` builds the very jitted function the trainer (or the
sampler) runs for `stage` (the same `trainer.step_kind(...)` / `steps.compile_*` / `engine._prefill` /
`engine._decode` code, not a copy) from abstract shapes that carry their shardings, compiles it
for the devices of a topology description (`jax.experimental.topologies`, which needs libtpu:
`pip install "jax[tpu]==<jax version>"`, see `libtpu_problem`), and returns a report:

- per-chip bytes of arguments, outputs, temporaries and their total against the chip's HBM;
- FLOPs and bytes accessed per step (XLA's cost analysis of the partitioned, per-chip program);
- collectives in the optimized HLO by type: the static count of instructions, and the count and
  bytes per step (each collective multiplied by the trip counts of the loops that hold it);
- compile time;
- a roofline estimate: compute at the chip's peak bf16 rate, HBM traffic at its bandwidth,
  collectives at the ICI bandwidth (DCN for those whose groups span slices), summed (no overlap)
  and maxed (perfect overlap); the estimated step time is the overlapped one, from which come the
  estimated MFU (model FLOPs, `lwm_jax.model.sizes`, over peak) and tokens/s/chip.

Stages: cpt, sft (the next-token step), gspo (the RL update), logprobs (the RL log-prob step),
agent-rl (the policy update at the agent RL stage's shapes), prefill and decode (the sampler's
prefill chunk, and the continuous engine's decode chunk over its slots with their KV cache, at the
RL rollout batch as slots and the RL context as each slot's cache; RL rollouts and the server run
this engine), decode-static (the static engine's decode loop at the same shapes).

Chip figures (docs/pods.md cites them): Google Cloud TPU documentation pages for v5p, v5e, v6e.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

STAGES = ("cpt", "sft", "gspo", "logprobs", "agent-rl", "prefill", "decode", "decode-static")
CONFIG_OF_STAGE = {"cpt": "cpt", "sft": "sft", "gspo": "rl", "logprobs": "rl",
                   "agent-rl": "agent_rl", "prefill": "rl", "decode": "rl", "decode-static": "rl"}
COLLECTIVES = ("all-to-all", "all-gather", "reduce-scatter", "all-reduce", "collective-permute")
GIB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  peak_bf16: float      # FLOP/s
  hbm_bytes: float
  hbm_bw: float         # bytes/s
  ici_bw: float         # bytes/s, bidirectional, per chip
  dcn_bw: float         # bytes/s per chip
  source: str


# Google Cloud TPU documentation (docs/pods.md has the addresses): v5p "Peak compute per chip
# (BF16) 459 TFLOPs; HBM 95 GiB, 2765 GBps; bidirectional ICI 1200 GBps per chip; DCN 50 Gbps per
# chip". v5e: 197 TFLOPs, 16 GB, 819 GBps, ICI 400 GBps; 2 x 100 Gbps NICs per 8-chip host (25
# Gbps per chip). v6e: 918 TFLOPs, 32 GB, 1638 GBps, ICI 800 GBps; its DCN figure is not in the
# table, 25 Gbps per chip is assumed as for v5e.
CHIPS = {
    "v5p": Chip("TPU v5p", 459e12, 95 * GIB, 2765e9, 1200e9, 50e9 / 8,
                "cloud.google.com/tpu/docs/v5p-training"),
    "v5e": Chip("TPU v5e", 197e12, 16e9, 819e9, 400e9, 25e9 / 8,
                "cloud.google.com/tpu/docs/v5e"),
    "v6e": Chip("TPU v6e", 918e12, 32e9, 1638e9, 800e9, 25e9 / 8,
                "cloud.google.com/tpu/docs/v6e"),
}


def libtpu_problem() -> str | None:
  """None when TPU topologies can be described here, else what is missing and how to install it."""
  try:
    import libtpu  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError:
    return (f"libtpu is not installed, so TPU programs cannot be compiled on this host. Install "
            f"the libtpu matching this JAX: pip install \"jax[tpu]=={jax.__version__}\" (or "
            f"`make test-tpu`, which builds .venv-tpu with the `.[tpu]` extra)")
  return None


def parse_topology(topology: str) -> tuple[Chip, str, int]:
  """'v5p:4x4x8' -> (chip, 'v5p:4x4x8', chips per slice); names the bad part."""
  m = re.fullmatch(r"(v5p|v5e|v6e):(\d+(?:x\d+){1,2})", topology.strip())
  if not m:
    raise ValueError(f"--topology: '{topology}' is not <chip>:<AxB[xC]> with chip one of "
                     f"{', '.join(CHIPS)} (e.g. v5p:4x4x8, v5e:16x16)")
  dims = [int(x) for x in m.group(2).split("x")]
  return CHIPS[m.group(1)], topology.strip(), int(np.prod(dims))


def topology_devices(topology: str, slices: int = 1) -> list:
  """The devices of `slices` slices of `topology` (a description: nothing runs on them)."""
  problem = libtpu_problem()
  if problem:
    raise RuntimeError(problem)
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
  # compile-only: no chip is claimed, so several processes may load libtpu at once
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  kw = {"num_slices": slices} if slices > 1 else {}
  desc = topologies.get_topology_desc(platform="tpu", topology_name=topology, **kw)
  return list(desc.devices)


# ----------------------------------------------------------------------------- the HLO
_ARRAY = re.compile(r"\b(pred|s4|u4|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64|"
                    r"f8e4m3fn|f8e5m2|f8e4m3|c64|c128)\[([\d,]*)\]")
_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4,
          "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "f8e4m3fn": 1,
          "f8e5m2": 1, "f8e4m3": 1, "c64": 8, "c128": 16}
_COLL = re.compile(r" = (?P<shape>.*?) (?P<op>all-to-all|ragged-all-to-all|all-gather-start|"
                   r"all-gather|reduce-scatter|all-reduce-start|all-reduce|"
                   r"collective-permute-start|collective-permute)\(")
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->.*\{\s*$")
_REFS = re.compile(r"\b(body|condition|calls|to_apply|branch_computations|called_computations)"
                   r"=(\{[^}]*\}|%?[\w.\-]+)")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+) = (.*?) ([\w\-]+)\((.*)$")
_CONST = re.compile(r"s32\[\]\S* constant\((\d+)\)")
_WHILE = re.compile(r"condition=%?([\w.\-]+), body=%?([\w.\-]+)")
_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_LIST = re.compile(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}")


def _arrays(shape: str) -> list[float]:
  return [float(np.prod([int(d) for d in dims.split(",") if d] or [1])) * _BYTES[t]
          for t, dims in _ARRAY.findall(shape)]


def _groups(line: str) -> list[list[int]] | None:
  m = _IOTA.search(line)
  if m:
    g, s = int(m.group(1)), int(m.group(2))
    dims = [int(x) for x in m.group(3).split(",")]
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if m.group(4):
      ids = ids.transpose([int(x) for x in m.group(4).split(",")])
    return ids.reshape(g, s).tolist()
  m = _LIST.search(line)
  if m:
    return [[int(x) for x in grp.split(",") if x] for grp in re.findall(r"\{([\d,]*)\}",
                                                                        m.group(1))]
  m = re.search(r"source_target_pairs=\{([^}]*(?:\}[^}]*)*?)\}\s*(?:,|$)", line)
  if m:
    pairs = re.findall(r"\{(\d+),(\d+)\}", line)
    return [[int(a), int(b)] for a, b in pairs]
  return None


def analyze_hlo(text: str, devices_per_slice: int | None = None) -> dict[str, Any]:
  """Collectives of an optimized HLO module: per type, the static count, and the count and bytes
  per execution of the entry computation (loop bodies multiplied by their known trip counts).
  Bytes are those a chip sends: all-gather (n-1)/n of its output, reduce-scatter (n-1)/n of its
  input, all-reduce 2(n-1)/n of its operand, all-to-all (n-1)/n, collective-permute all of it.
  `cross_slice_bytes` counts what goes between slices (groups spanning slices)."""
  comps: dict[str, list[str]] = {}
  entry, cur = None, None
  for line in text.splitlines():
    m = _COMP.match(line)
    if m and not line.startswith(" "):
      cur = m.group(2)
      comps[cur] = []
      if m.group(1):
        entry = cur
      continue
    if cur is not None:
      if line.startswith("}"):
        cur = None
      else:
        comps[cur].append(line)
  def trip_count(line: str) -> int:
    """A while loop's trip count: XLA's known_trip_count when printed, else the largest s32
    constant its condition compares with (scans and fori loops count from 0; a loop that may
    stop early, like the decode loop, gets its bound)."""
    tm = _TRIP.search(line)
    if tm:
      return int(tm.group(1))
    wm = _WHILE.search(line)
    consts = [int(x) for x in _CONST.findall("\n".join(comps.get(wm.group(1), [])))] if wm else []
    return max(consts) if consts else 1

  callers: dict[str, list[tuple[str, int]]] = {}
  trips = []
  for name, lines in comps.items():
    for line in lines:
      refs = _REFS.findall(line)
      if not refs:
        continue
      trip = trip_count(line) if " while(" in line else 1
      if trip > 1:
        trips.append(trip)
      for kind, target in refs:
        names = [t.strip().lstrip("%") for t in target.strip("{}").split(",") if t.strip()]
        for t in names:
          callers.setdefault(t, []).append((name, trip if kind == "body" else 1))

  @functools.lru_cache(maxsize=None)
  def mult(name: str) -> int:
    if name == entry:
      return 1
    return sum(mult(c) * f for c, f in callers.get(name, []))

  out = {k: {"static": 0, "count": 0, "bytes": 0.0, "max_group": 0} for k in COLLECTIVES}
  cross = 0.0
  shapes: dict[str, list[int]] = {}
  for lines in comps.values():
    for line in lines:
      im = _INSTR.match(line)
      if im:
        arr = _ARRAY.search(im.group(2))
        if arr:
          shapes[im.group(1)] = [int(d) for d in arr.group(2).split(",") if d]
  dot_static = dot_total = 0.0
  for name, lines in comps.items():
    k_mult = mult(name) if entry is not None else 1
    for line in lines:
      f = _dot_flops(line, shapes)
      if f:
        dot_static += f
        dot_total += f * k_mult
      m = _COLL.search(line)
      if not m:
        continue
      op = m.group("op").replace("-start", "").replace("ragged-", "")
      sizes = _arrays(m.group("shape"))
      if not sizes:
        continue
      if m.group("op") == "all-gather-start":
        sizes = sizes[len(sizes) // 2:]
      elif m.group("op") == "collective-permute-start":
        sizes = sizes[:1]
      size = sum(sizes)
      groups = _groups(line)
      n = max((len(g) for g in groups), default=1) if groups else 1
      if op == "all-gather":
        sent = size * (n - 1) / max(n, 1)
      elif op == "reduce-scatter":
        sent = size * (n - 1)
      elif op == "all-reduce":
        sent = 2 * size * (n - 1) / max(n, 1)
      elif op == "all-to-all":
        sent = size * (n - 1) / max(n, 1)
      else:
        sent = size
      rec = out[op]
      rec["static"] += 1
      rec["count"] += k_mult
      rec["bytes"] += sent * k_mult
      rec["max_group"] = max(rec["max_group"], n)
      if devices_per_slice and groups and any(
          len({d // devices_per_slice for d in g}) > 1 for g in groups):
        cross += sent * k_mult
  hbm = _hbm_bytes(comps, entry, mult)
  return {"collectives": out, "cross_slice_bytes": cross, "loops": sorted(set(trips)),
          "dot_flops_static": dot_static, "dot_flops": dot_total, **hbm}


# ops that move no HBM bytes of their own (control flow, views, and the collectives, which the
# ICI term counts) for the byte count below
_NO_BYTES = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call",
             "conditional", "after-all", "partition-id", "replica-id", "opt-barrier",
             "copy-start", "copy-done", "async-start", "async-update", "async-done", "send",
             "send-done", "recv", "recv-done", "all-gather", "all-gather-start",
             "all-gather-done", "all-reduce", "all-reduce-start", "all-reduce-done",
             "reduce-scatter", "all-to-all", "ragged-all-to-all", "collective-permute",
             "collective-permute-start", "collective-permute-done"}


def _hbm_bytes(comps: dict[str, list[str]], entry: str | None, mult) -> dict[str, Any]:
  """HBM bytes a step moves, counted per instruction of the computations that run as such (the
  entry, loop bodies and conditions, branches, calls; not the bodies of fusions, which run in
  registers and VMEM) as output + operand bytes, each multiplied by the trip counts of the
  loops that hold it. A slice read (dynamic-slice of a fusion parameter) counts the slice, an
  in-place update (a dynamic-update-slice root) counts the update, as XLA's cost analysis does.
  Returns the scaled and unscaled sums and the instructions moving the most bytes."""
  # one pass over the module: each value's bytes; per computation, its parameters by index,
  # each value's definition (op, operands, line) and uses, the fusions it calls, its root; and
  # the control-flow edges (loop bodies and conditions, branches, calls)
  size: dict[str, float] = {}
  fused: dict[str, dict[str, Any]] = {}
  flow: dict[str, set[str]] = {}
  for name, lines in comps.items():
    fc: dict[str, Any] = {"params": {}, "root": None, "uses": {}, "defs": {}, "calls": {}}
    for line in lines:
      im = _INSTR.match(line)
      if not im:
        continue
      v, op = im.group(1), im.group(3)
      size[v] = sum(_arrays(im.group(2)))
      args = re.findall(r"%([\w.\-]+)", im.group(4).split("), ")[0])
      if op == "parameter":
        pm = re.match(r"(\d+)\)", im.group(4))
        if pm:
          fc["params"][int(pm.group(1))] = v
      elif op == "fusion":
        cm = re.search(r"calls=%?([\w.\-]+)", line)
        if cm:
          fc["calls"][v] = cm.group(1)
      for kind, target in _REFS.findall(line):
        if kind in ("body", "condition", "branch_computations") or (
            kind == "to_apply" and op == "call"):
          flow.setdefault(name, set()).update(
              t.strip().lstrip("%") for t in target.strip("{}").split(",") if t.strip())
      if line.lstrip().startswith("ROOT"):
        fc["root"] = v
      fc["defs"][v] = (op, args, line)
      for pos, arg in enumerate(args):
        fc["uses"].setdefault(arg, []).append((op, v, pos))
    fused[name] = fc

  def read(comp: str, value: str, full: float, depth: int = 0) -> float:
    """Bytes of `value` the fused computation `comp` reads: the slices taken of it (through
    bitcasts and nested fusions), nothing when it is only the buffer of an in-place update,
    else all of it."""
    fc = fused.get(comp)
    us = fc["uses"].get(value, []) if fc else []
    if not us or depth > 8:
      return full
    got = 0.0
    for op, v, pos in us:
      if op in ("dynamic-slice", "slice") and pos == 0:
        got += size.get(v, full)
      elif op == "dynamic-update-slice" and pos == 0:
        continue
      elif op == "bitcast":
        got += read(comp, v, full, depth + 1)
      elif op == "fusion" and v in fc["calls"]:
        inner = fused.get(fc["calls"][v], {}).get("params", {}).get(pos)
        got += read(fc["calls"][v], inner, full, depth + 1) if inner else full
      else:
        return full
    return min(got, full)

  def written(comp: str, value: str | None, full: float) -> float:
    """Bytes the root `value` of `comp` writes: the update of an in-place update, per output."""
    fc = fused.get(comp)
    if not fc or value is None or value not in fc["defs"]:
      return full
    op, args, _ = fc["defs"][value]
    if op == "dynamic-update-slice" and len(args) > 1:
      return size.get(args[1], full)
    if op == "tuple":
      return sum(written(comp, a, size.get(a, 0.0)) for a in args)
    return full

  # the computations reached from the entry as control flow (not as fusion bodies or reducers)
  runs, todo = set(), [entry] if entry else []
  while todo:
    c_name = todo.pop()
    if c_name not in runs:
      runs.add(c_name)
      todo.extend(flow.get(c_name, ()))
  static = total = 0.0
  top: list[tuple[float, str, str, str]] = []
  for name in runs:
    k_mult = mult(name)
    calls = fused.get(name, {}).get("calls", {})
    for v, (op, args, line) in fused.get(name, {}).get("defs", {}).items():
      if op in _NO_BYTES:
        continue
      out_b = size[v]
      arg_b = [size.get(a, 0.0) for a in args]
      if op == "dynamic-slice":
        b = 2 * out_b
      elif op == "dynamic-update-slice":
        b = 2 * (arg_b[1] if len(arg_b) > 1 else out_b)
      elif op == "fusion" and v in calls:
        callee = calls[v]
        params = fused.get(callee, {}).get("params", {})
        b = written(callee, fused.get(callee, {}).get("root"), out_b) + sum(
            read(callee, params[i], ab) if i in params else ab for i, ab in enumerate(arg_b))
      else:
        b = out_b + sum(arg_b)
      b = max(b, 0.0)
      static += b
      total += b * k_mult
      meta = re.search(r'op_name="([^"]*)"', line)
      top.append((b * k_mult, v, op, meta.group(1)[-120:] if meta else ""))
  top.sort(reverse=True)
  by_op: dict[str, float] = {}  # the JAX primitive that made each instruction (its op_name's end)
  for b, _, o, m in top:
    key = m.rsplit("/", 1)[-1] if m else o
    by_op[key] = by_op.get(key, 0.0) + b
  return {"hbm_bytes_static": static, "hbm_bytes": total,
          "top_hbm": [{"name": n, "op": o, "op_name": m, "gib": b / GIB}
                      for b, n, o, m in top[:10]],
          "hbm_by_op": {k: v / GIB for k, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:12]}}


def _dot_flops(line: str, shapes: dict[str, list[int]]) -> float:
  """FLOPs of one dot or convolution instruction (2 x output size x contracted size), from the
  operand shapes recorded by name; 0 for anything else."""
  im = _INSTR.match(line)
  if not im or im.group(3) not in ("dot", "convolution"):
    return 0.0
  out = _ARRAY.search(im.group(2))
  if not out:
    return 0.0
  out_n = float(np.prod([int(d) for d in out.group(2).split(",") if d] or [1]))
  operands = re.findall(r"%([\w.\-]+)", im.group(4).split(")")[0])
  if len(operands) < 2:
    return 0.0
  if im.group(3) == "dot":
    lhs = shapes.get(operands[0])
    cm = re.search(r"lhs_contracting_dims=\{([\d,]*)\}", line)
    if lhs is None or not cm:
      return 0.0
    k = float(np.prod([lhs[int(i)] for i in cm.group(1).split(",") if i] or [1]))
    return 2.0 * out_n * k
  rhs = shapes.get(operands[1])
  dm = re.search(r"dim_labels=\w+_(\w+)->", line)
  wm = re.search(r"window=\{size=([\dx]+)", line)
  if rhs is None or not dm:
    return 0.0
  labels = dm.group(1)
  k = float(np.prod([d for d, c in zip(rhs, labels) if c == "i"] or [1]))
  if wm:  # window dims that stand for batch dims (lhs dilated by the window) contract nothing
    sizes = [int(x) for x in wm.group(1).split("x")]
    dm2 = re.search(r"lhs_dilate=([\dx]+)", line)
    dil = [int(x) for x in dm2.group(1).split("x")] if dm2 else [1] * len(sizes)
    k *= float(np.prod([-(-sz // dl) for sz, dl in zip(sizes, dil)]))
  return 2.0 * out_n * k


def roofline(chip: Chip, flops: float, bytes_accessed: float, coll: dict, model_flops: float,
             tokens: int, chips: int) -> dict[str, float]:
  """Step-time estimate from the per-chip FLOPs, HBM bytes and collective bytes (see module)."""
  compute_s = flops / chip.peak_bf16
  hbm_s = bytes_accessed / chip.hbm_bw
  total = sum(v["bytes"] for v in coll["collectives"].values())
  cross = coll["cross_slice_bytes"]
  ici_s = (total - cross) / chip.ici_bw
  dcn_s = cross / chip.dcn_bw
  comm_s = ici_s + dcn_s
  step_s = max(compute_s, hbm_s, comm_s)
  return {"compute_s": compute_s, "hbm_s": hbm_s, "ici_s": ici_s, "dcn_s": dcn_s,
          "est_step_s": step_s, "est_step_s_no_overlap": compute_s + hbm_s + comm_s,
          "bound": max((("compute", compute_s), ("hbm", hbm_s), ("collectives", comm_s)),
                       key=lambda kv: kv[1])[0],
          "est_mfu": model_flops / chips / (step_s * chip.peak_bf16) if step_s > 0 else 0.0,
          "tokens_per_s_per_chip": tokens / chips / step_s if step_s > 0 else 0.0}


# ----------------------------------------------------------------------------- the stages
def stage_config(stage: str, preset: str, overrides: dict | None = None):
  """The training config of `stage` for `preset` (configs/<stage>.py:<preset>) with overrides
  given as dotted keys ({"train.micro_batches": 8, "model.num_hidden_layers": 2})."""
  import importlib  # pylint: disable=import-outside-toplevel
  if stage not in STAGES:
    raise ValueError(f"--stages: '{stage}' is not one of {', '.join(STAGES)}")
  c = importlib.import_module(f"configs.{CONFIG_OF_STAGE[stage]}").get_config(preset)
  for key, value in (overrides or {}).items():
    node = c
    parts = key.split(".")
    for p in parts[:-1]:
      node = node[p]
    if parts[-1] not in node:
      raise ValueError(f"override '{key}': config has no field '{parts[-1]}'")
    node[parts[-1]] = type(node[parts[-1]])(value) if node[parts[-1]] is not None else value
  return c


def _mesh(c, devices):
  from lwm_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  return shd.make_mesh(**c.mesh.to_dict(), devices=devices)


def _abstract(shape, dtype, sharding):
  return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def build_lowered(c, stage: str, devices: list, platform_name: str = "tpu"):
  """(lowered, info): the stage's jitted function lowered for `devices` from abstract inputs."""
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=import-outside-toplevel
  from lwm_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  from lwm_jax.model import platform  # pylint: disable=import-outside-toplevel
  from lwm_jax.train import optimizer as opt_lib  # pylint: disable=import-outside-toplevel
  from lwm_jax.train import state as state_lib  # pylint: disable=import-outside-toplevel
  from lwm_jax.train import steps as steps_lib  # pylint: disable=import-outside-toplevel
  from lwm_jax.train import trainer  # pylint: disable=import-outside-toplevel
  from lwm_jax.train.run_config import sharding_rules  # pylint: disable=import-outside-toplevel
  from lwm_jax.model.config import ModelConfig  # pylint: disable=import-outside-toplevel

  t = c.train
  model_cfg = ModelConfig.from_dict(c.model.to_dict()).validate()
  model_cfg = opt_lib.apply_precision(model_cfg, t.precision, platform_name)
  mesh = _mesh(c, devices)
  tx, schedule = opt_lib.make_optimizer(c.optim, t.num_steps)
  info: dict[str, Any] = {"mesh": dict(mesh.shape), "model_dtype": model_cfg.dtype}
  with platform.target(platform_name):
    graphdef, state, shardings = state_lib.abstract_train_state(model_cfg, tx, mesh,
                                                                sharding_rules(c))
    info["moe_backend"] = _moe_backend(model_cfg)
    if stage in ("cpt", "sft", "gspo", "agent-rl", "logprobs"):
      kind_name = {"cpt": "cpt", "sft": "sft", "gspo": "rl", "agent-rl": "agent-rl",
                   "logprobs": "rl"}[stage]
      kind = trainer.step_kind(kind_name)
      shapes = kind.shapes(t.batch_size, t.seq_len)
      if stage == "logprobs":
        shapes = {k: shapes[k] for k in ("tokens", "positions", "segment_ids")}
        step = steps_lib.compile_logprobs(graphdef, mesh, shardings, shapes)
      else:
        step = kind.compile(graphdef, tx, schedule, trainer._step_config(c, model_cfg), mesh,  # pylint: disable=protected-access
                            shardings, shapes)
      batch = {k: jax.ShapeDtypeStruct(s, jnp.float32 if k in ("loss_weights", "old_logprobs",
                                                                "advantages", "ref_logprobs")
                                       else jnp.int32) for k, s in shapes.items()}
      lowered = step.lower(state, batch)
      trainer._warn_if_replicated(c, mesh)  # pylint: disable=protected-access
      info.update(batch=t.batch_size, seq_len=t.seq_len, micro_batches=t.micro_batches,
                  tokens=t.batch_size * t.seq_len,
                  batch_replicated_over=list(shd.replicated_batch_axes(
                      t.batch_size // t.micro_batches, mesh)),
                  model_flops=_train_flops(model_cfg, t.seq_len, stage) * t.batch_size * t.seq_len)
      return lowered, info
    return _sampler_lowered(c, stage, graphdef, state.params, model_cfg, mesh, info)


def _moe_backend(cfg) -> str:
  from lwm_jax.model.moe import resolve_backend  # pylint: disable=import-outside-toplevel
  return resolve_backend(cfg.moe_backend) if cfg.num_experts > 0 else "none"


def _train_flops(cfg, seq_len: int, stage: str) -> float:
  from lwm_jax.model import sizes  # pylint: disable=import-outside-toplevel
  f = sizes.count(cfg).train_flops_per_token(cfg, seq_len)
  return f / 3 if stage == "logprobs" else f  # forward only: a third of forward + backward


def _sampler_lowered(c, stage, graphdef, params, model_cfg, mesh, info):
  from jax.sharding import NamedSharding  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from lwm_jax import sharding as shd  # pylint: disable=import-outside-toplevel
  from lwm_jax.model.transformer import Transformer  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling import engine as eng  # pylint: disable=import-outside-toplevel

  r = c.rl
  b = int(c.train.batch_size * max(int(r.get("updates_per_batch", 1)), 1))
  t_len = int(c.train.seq_len)
  prefill_chunk = int(r.engine.get("prefill_chunk", 0) or 512)
  steps = int(r.engine.get("chunk_steps", 0) or 16)
  key = json.dumps(model_cfg.to_dict(), sort_keys=True)
  graph = eng._Graph(graphdef, key)  # pylint: disable=protected-access

  def bsh(shape, dtype):
    return _abstract(shape, dtype, NamedSharding(mesh, shd.batch_spec(shape[0], mesh,
                                                                      len(shape))))

  cache_abs = jax.eval_shape(lambda: nnx.eval_shape(
      lambda: Transformer(model_cfg, rngs=nnx.Rngs(0))).init_cache(b, t_len))
  cache = jax.tree.map(lambda a: bsh(a.shape, a.dtype), cache_abs)
  vocab = model_cfg.vocab_size
  info.update(batch=b, cache_len=t_len)
  n_params_active = _active_params(model_cfg)
  if stage == "prefill":
    tokens = bsh((b, prefill_chunk), jnp.int32)
    with jax.set_mesh(mesh):
      lowered = eng._prefill.lower(graph, params, cache, tokens, bsh((b,), jnp.int32),  # pylint: disable=protected-access
                                   bsh((b,), jnp.int32), bsh((b,), jnp.int32),
                                   bsh((b, vocab), jnp.float32))
    info.update(prefill_chunk=prefill_chunk, tokens=b * prefill_chunk,
                model_flops=2.0 * n_params_active * b * prefill_chunk)
    return lowered, info
  rows = eng._Rows(  # pylint: disable=protected-access
      temperature=bsh((b,), jnp.float32), top_k=bsh((b,), jnp.int32),
      top_p=bsh((b,), jnp.float32), min_p=bsh((b,), jnp.float32), seed=bsh((b,), jnp.int32),
      choice=bsh((b,), jnp.int32), max_new=bsh((b,), jnp.int32),
      stop_ids=bsh((b, 4), jnp.int32), min_new=bsh((b,), jnp.int32),
      repetition=bsh((b,), jnp.float32),
      presence=bsh((b,), jnp.float32), frequency=bsh((b,), jnp.float32))
  carry = dict(logits=bsh((b, vocab), jnp.float32), pos=bsh((b,), jnp.int32),
               n_gen=bsh((b,), jnp.int32), done=bsh((b,), jnp.bool_),
               finish=bsh((b,), jnp.int32), counts=bsh((b, vocab), jnp.int32),
               seen=bsh((b, vocab), jnp.bool_))
  with jax.set_mesh(mesh):
    if stage == "decode":  # the continuous engine: every slot busy, attention over the whole cache
      from lwm_jax.sampling import continuous  # pylint: disable=import-outside-toplevel
      lowered = continuous._decode_slots.lower(  # pylint: disable=protected-access
          graph, steps, t_len, b, t_len, 0, params, cache, carry, rows)
    else:
      lowered = eng._decode.lower(graph, steps, t_len, 0, params, cache, carry, rows)  # pylint: disable=protected-access
  info.update(decode_steps=steps, tokens=b * steps, engine="static" if stage ==
              "decode-static" else "continuous",
              model_flops=2.0 * n_params_active * b * steps)
  return lowered, info


def _active_params(cfg) -> float:
  from lwm_jax.model import sizes  # pylint: disable=import-outside-toplevel
  return float(sizes.count(cfg).active_params)


def compile_stage(c, stage: str, topology: str, slices: int = 1, *, preset: str = "",
                  dump_hlo: str = "") -> dict[str, Any]:
  """Compiles `stage` of config `c` for `slices` x `topology`; returns the report row."""
  chip, topo, per_slice = parse_topology(topology)
  devices = topology_devices(topo, slices)
  chips = len(devices)
  row: dict[str, Any] = {"preset": preset, "stage": stage, "topology": topo, "slices": slices,
                         "chips": chips, "chip": chip.name,
                         "hbm_capacity_gib": chip.hbm_bytes / GIB,
                         "layers": int(c.model.num_hidden_layers),
                         "scan_layers": bool(c.model.get("scan_layers", False)),
                         "remat": bool(c.model.get("remat", False))}
  t0 = time.perf_counter()
  lowered, info = build_lowered(c, stage, devices)
  row["lower_s"] = time.perf_counter() - t0
  row.update({k: v for k, v in info.items() if k != "model_flops"})
  t1, c1 = time.perf_counter(), time.process_time()
  try:
    compiled = lowered.compile()
  except Exception as e:  # pylint: disable=broad-except
    msg = str(e)
    row.update(compile_s=time.perf_counter() - t1, fits=False,
               error=msg.splitlines()[0][:500] if msg else type(e).__name__)
    if len(msg.splitlines()) > 1:  # the compiler's list of the largest allocations, for the JSON
      row["error_detail"] = msg[:20000]
    m = re.search(r"([\d.]+)G\) exceeds available HBM \(([\d.]+)G", msg)
    if m:
      row["hbm_gib_per_chip"] = float(m.group(1))
    return row
  # wall seconds, and the CPU seconds of this process (all threads): on a shared host the
  # second is the steadier measure
  row["compile_s"] = time.perf_counter() - t1
  row["compile_cpu_s"] = time.process_time() - c1
  mem = compiled.memory_analysis()
  args = float(getattr(mem, "argument_size_in_bytes", 0))
  outs = float(getattr(mem, "output_size_in_bytes", 0))
  alias = float(getattr(mem, "alias_size_in_bytes", 0))
  temps = float(getattr(mem, "temp_size_in_bytes", 0))
  code = float(getattr(mem, "generated_code_size_in_bytes", 0))
  total = args + outs - alias + temps + code
  row.update(args_gib=args / GIB, outputs_gib=outs / GIB, alias_gib=alias / GIB,
             temps_gib=temps / GIB, hbm_gib_per_chip=total / GIB,
             fits=total <= chip.hbm_bytes, headroom=1.0 - total / chip.hbm_bytes)
  cost = compiled.cost_analysis()
  if isinstance(cost, (list, tuple)):
    cost = cost[0] if cost else {}
  flops = float(cost.get("flops", 0.0))
  bytes_acc = float(cost.get("bytes accessed", 0.0))
  text = compiled.as_text()
  if dump_hlo:
    with open(dump_hlo, "w", encoding="utf-8") as f:
      f.write(text)
  coll = analyze_hlo(text, per_slice if slices > 1 else None)
  # XLA's cost analysis counts a loop body once: with the layers scanned (and micro-batches
  # accumulated in a scan) it undercounts. The matmul FLOPs counted from the HLO with each loop's
  # trip count correct the FLOPs.
  scale = coll["dot_flops"] / coll["dot_flops_static"] if coll["dot_flops_static"] else 1.0
  # The bytes: XLA's count scaled by the loops' trips weighted by where the bytes are (each
  # instruction's bytes with its own loops' trips, _hbm_bytes), not by where the matmul FLOPs
  # are (which charged every byte outside the layer loop, the optimizer's included, at the
  # layer loop's trips).
  byte_scale = (coll["hbm_bytes"] / coll["hbm_bytes_static"] if coll["hbm_bytes_static"]
                else scale)
  row.update(flops_per_chip_xla=flops, bytes_accessed_per_chip_xla=bytes_acc,
             matmul_flops_per_chip=coll["dot_flops"], loop_scale=scale, byte_scale=byte_scale,
             hbm_bytes_counted_static=coll["hbm_bytes_static"],
             bytes_accessed_flop_scaled=bytes_acc * scale, top_hbm=coll["top_hbm"],
             hbm_gib_by_op=coll["hbm_by_op"])
  flops, bytes_acc = max(flops * scale, coll["dot_flops"]), bytes_acc * byte_scale
  row.update(flops_per_chip=flops, bytes_accessed_per_chip=bytes_acc,
             model_flops_per_chip=info["model_flops"] / chips,
             collectives=coll["collectives"], cross_slice_bytes=coll["cross_slice_bytes"],
             loop_trip_counts=coll["loops"])
  # Pallas kernels (the TPU grouped matmul) are custom calls whose FLOPs XLA does not count:
  # the compute time is at least the model's FLOPs at peak
  row.update(roofline(chip, max(flops, info["model_flops"] / chips), bytes_acc, coll,
                      info["model_flops"], info["tokens"], chips))
  return row


# ----------------------------------------------------------------------------- the report
def markdown(rows: list[dict]) -> str:
  head = ("| preset | stage | topology | chips | mesh | fits | GiB/chip (args+out+temps) / HBM "
          "| compile s | FLOPs/chip | est step s | bound | est MFU | tok/s/chip | collectives "
          "per step (count, GiB sent) |\n|" + "---|" * 14 + "\n")
  lines = []
  for r in rows:
    mesh = "x".join(f"{k[0]}{v}" for k, v in (r.get("mesh") or {}).items() if v > 1) or "1"
    if "error" in r:
      hbm = r.get("hbm_gib_per_chip")
      lines.append(f"| {r['preset']} | {r['stage']} | {r['topology']} | {r['chips']} | {mesh} | "
                   f"no | {hbm if hbm is None else f'{hbm:.1f}'} / {r['hbm_capacity_gib']:.1f} "
                   f"| {r['compile_s']:.0f} | | | | | | {r['error'][:120]} |")
      continue
    coll = ", ".join(f"{k} {v['count']} ({v['bytes'] / GIB:.2f})"
                     for k, v in r["collectives"].items() if v["count"])
    lines.append(
        f"| {r['preset']} | {r['stage']} | {r['topology']} | {r['chips']} | {mesh} | "
        f"{'yes' if r['fits'] else 'NO'} ({100 * r['headroom']:.0f}% free) | "
        f"{r['hbm_gib_per_chip']:.1f} ({r['args_gib']:.1f}+{r['outputs_gib'] - r['alias_gib']:.1f}"
        f"+{r['temps_gib']:.1f}) / {r['hbm_capacity_gib']:.1f} | {r['compile_s']:.0f} | "
        f"{r['flops_per_chip']:.3g} | {r['est_step_s']:.3g} | {r['bound']} | "
        f"{100 * r['est_mfu']:.1f}% | {r['tokens_per_s_per_chip']:.0f} | {coll} |")
  return head + "\n".join(lines) + "\n"


def write_report(rows: list[dict], out_json: str, out_md: str, notes: str = "") -> None:
  """Merges `rows` into the JSON's rows (same preset, stage, topology, slices replaced) and
  rewrites the markdown table; the markdown's text between its heading and the table (notes on
  the rows, written by hand) is kept unless `notes` replaces it."""
  old = []
  if os.path.exists(out_json):
    with open(out_json, encoding="utf-8") as f:
      old = json.load(f).get("rows", [])
  key = lambda r: (r["preset"], r["stage"], r["topology"], r.get("slices", 1))  # noqa: E731
  new_keys = {key(r) for r in rows}
  merged = [r for r in old if key(r) not in new_keys] + rows
  os.makedirs(os.path.dirname(out_json) or ".", exist_ok=True)
  with open(out_json, "w", encoding="utf-8") as f:
    json.dump({"rows": merged, "jax": jax.__version__}, f, indent=1, sort_keys=True)
  head = ("# Pod presets compiled for TPU topologies on a CPU host\n\n"
          "Written by `launch/compile.py` (docs/pods.md explains each column). Estimates are "
          "a roofline from XLA's per-chip cost and the chip's published figures, not "
          "measurements.\n\n")
  if not notes and os.path.exists(out_md):  # keep what was written about the rows by hand
    with open(out_md, encoding="utf-8") as f:
      text = f.read()
    table = text.find("\n| preset |")
    if text.startswith(head) and table >= len(head):
      notes = text[len(head):table].strip()
  with open(out_md, "w", encoding="utf-8") as f:
    f.write(head + (notes + "\n\n" if notes else "") + markdown(merged))
