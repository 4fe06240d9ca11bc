"""Hugging Face checkpoints <-> `Transformer`: `load_pretrained` and `save_pretrained`.

A checkpoint folder holds `config.json` and either `model.safetensors` or
`model.safetensors.index.json` with its shards. Understood on-disk forms:
  - tensor prefix `model.` (Qwen3MoeForCausalLM, Qwen3_5MoeForCausalLM) or `model.language_model.`
    (released Qwen3.5 checkpoints, whose `model.visual.*` and `mtp.*` tensors are skipped and counted);
  - experts per expert (`mlp.experts.{e}.gate_proj.weight` [I, D], ...) or fused
    (`mlp.experts.gate_up_proj` [E, 2I, D], gate rows first, and `mlp.experts.down_proj` [E, D, I]);
  - HF linear weights are [out, in] (ours [in, out]); conv1d is [C, 1, K] (ours [C, K]).

Loading builds the model abstractly (`nnx.eval_shape`) and fills it one parameter at a time: each
parameter is read from its tensor(s) (memory-mapped, sliced where only part is needed), converted on
the host and placed straight into its target sharding, so the checkpoint never sits in host memory
twice. Missing, unexpected and mis-shaped tensors raise `CheckpointError` naming tensor, shapes and file;
so do `config.json` fields of the wrong JSON type (every such field is named). The expert layout is
read from the text model's own tensors (`mtp.*` and `model.visual.*` are not looked at). The tokenizer
and `generation_config.json` of an export are written by `lwm_jax.hf_tokenizer`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
from typing import Any, Callable, Iterator

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from safetensors import safe_open
from safetensors.numpy import save_file

from lwm_jax import hf_tokenizer
from lwm_jax import sharding as shd
from lwm_jax.hf_tokenizer import CheckpointError, read_json  # noqa: F401  (re-exported)
from lwm_jax.model import abstract_model
from lwm_jax.model.config import ModelConfig, from_hf_dict, to_hf_dict
from lwm_jax.model.layers import DTYPES
from lwm_jax.model.transformer import Transformer

log = logging.getLogger(__name__)

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
RELEASED_PREFIX = "model.language_model."
TEXT_PREFIX = "model."
SKIPPED_PREFIXES = ("model.visual.", "mtp.")
EXPERT_LAYOUTS = ("per_expert", "fused")


# ------------------------------------------------------------------------------ parameter mapping
@dataclasses.dataclass(frozen=True)
class _Target:
  """One model parameter and the HF tensor(s) it comes from.

  kind: same (identical shape) | t (2-D transpose) | conv ([C,1,K] <-> [C,K]) |
        experts_t (E tensors [out,in] <-> [E,in,out]) | fused_gate / fused_up (half of
        gate_up_proj [E,2I,D] <-> [E,D,I]) | fused_down ([E,D,I] <-> [E,I,D]).
  """
  path: tuple
  kind: str
  keys: tuple[str, ...]


def _targets(cfg: ModelConfig, prefix: str, expert_layout: str) -> list[_Target]:
  """The full parameter <-> tensor table for a config, in model order."""
  out: list[_Target] = [_Target(("embed_tokens",), "same", (prefix + "embed_tokens.weight",))]

  def lin(path: tuple, key: str) -> None:
    out.append(_Target(path + ("kernel",), "t", (key + ".weight",)))

  def norm(path: tuple, key: str) -> None:
    out.append(_Target(path + ("scale",), "same", (key + ".weight",)))

  for i in range(cfg.num_hidden_layers):
    p, L = prefix + f"layers.{i}.", ("layers", i)
    norm(L + ("input_layernorm",), p + "input_layernorm")
    norm(L + ("post_attention_layernorm",), p + "post_attention_layernorm")
    if cfg.layer_type(i) == "linear_attention":
      a, A = p + "linear_attn.", L + ("linear_attn",)
      for name in ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"):
        lin(A + (name,), a + name)
      out.append(_Target(A + ("conv1d",), "conv", (a + "conv1d.weight",)))
      out.append(_Target(A + ("A_log",), "same", (a + "A_log",)))
      out.append(_Target(A + ("dt_bias",), "same", (a + "dt_bias",)))
      norm(A + ("norm",), a + "norm")
    else:
      a, A = p + "self_attn.", L + ("self_attn",)
      for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        lin(A + (name,), a + name)
      norm(A + ("q_norm",), a + "q_norm")
      norm(A + ("k_norm",), a + "k_norm")
    m, M = p + "mlp.", L + ("mlp",)
    if not cfg.is_moe_layer(i):
      for name in ("gate_proj", "up_proj", "down_proj"):
        lin(M + (name,), m + name)
      continue
    X = M + ("experts",)
    out.append(_Target(X + ("router",), "t", (m + "gate.weight",)))
    if expert_layout == "fused":
      gu = (m + "experts.gate_up_proj",)
      out.append(_Target(X + ("gate_proj",), "fused_gate", gu))
      out.append(_Target(X + ("up_proj",), "fused_up", gu))
      out.append(_Target(X + ("down_proj",), "fused_down", (m + "experts.down_proj",)))
    else:
      for name in ("gate_proj", "up_proj", "down_proj"):
        keys = tuple(f"{m}experts.{e}.{name}.weight" for e in range(cfg.num_experts))
        out.append(_Target(X + (name,), "experts_t", keys))
    if cfg.is_hybrid and cfg.shared_expert_intermediate_size > 0:
      for name in ("gate_proj", "up_proj", "down_proj"):
        lin(M + ("shared_expert", name), m + "shared_expert." + name)
      lin(M + ("shared_expert_gate",), m + "shared_expert_gate")
  norm(("norm",), prefix + "norm")
  if not cfg.tie_word_embeddings:
    lin(("lm_head",), "lm_head")
  return out


def _hf_shapes(t: _Target, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
  """The shape each HF tensor of a target must have, given the model parameter's shape."""
  if t.kind == "same":
    return [shape]
  if t.kind == "t":
    return [shape[::-1]]
  if t.kind == "conv":
    return [(shape[0], 1, shape[1])]
  if t.kind == "experts_t":
    return [(shape[2], shape[1])] * len(t.keys)
  if t.kind in ("fused_gate", "fused_up"):
    return [(shape[0], 2 * shape[2], shape[1])]
  if t.kind == "fused_down":
    return [(shape[0], shape[2], shape[1])]
  raise AssertionError(t.kind)


def _to_model(t: _Target, read: Callable[..., np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
  """Builds one parameter from its tensor(s); `read(key, slices=None)` returns a numpy array."""
  k = t.keys
  if t.kind == "same":
    return read(k[0])
  if t.kind == "t":
    return read(k[0]).T
  if t.kind == "conv":
    return read(k[0])[:, 0, :]
  if t.kind == "experts_t":
    first = read(k[0])
    out = np.empty(shape, first.dtype)
    out[0] = first.T
    for e in range(1, len(k)):
      out[e] = read(k[e]).T
    return out
  inter = shape[2] if t.kind != "fused_down" else shape[1]
  if t.kind == "fused_gate":
    return read(k[0], (slice(None), slice(0, inter), slice(None))).transpose(0, 2, 1)
  if t.kind == "fused_up":
    return read(k[0], (slice(None), slice(inter, 2 * inter), slice(None))).transpose(0, 2, 1)
  return read(k[0]).transpose(0, 2, 1)  # fused_down


# ----------------------------------------------------------------------------------- reading files
_INT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size",
               "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
               "num_experts", "num_local_experts", "num_experts_per_tok", "decoder_sparse_step",
               "max_position_embeddings", "full_attention_interval",
               "shared_expert_intermediate_size", "linear_num_key_heads", "linear_num_value_heads",
               "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
               "original_max_position_embeddings")
_FLOAT_FIELDS = ("rms_norm_eps", "rope_theta", "router_aux_loss_coef", "partial_rotary_factor",
                 "factor", "attention_factor", "beta_fast", "beta_slow")
# the fields of a `rope_parameters` / `rope_scaling` object whose JSON type is checked
_ROPE_CHECKED = ("rope_theta", "partial_rotary_factor", "factor", "attention_factor", "beta_fast",
                 "beta_slow", "original_max_position_embeddings")
_BOOL_FIELDS = ("tie_word_embeddings", "norm_topk_prob")
_STR_FIELDS = ("model_type", "dtype", "torch_dtype")
# null means "use the default" for these (the reader falls back); for the others it is an error
_NULLABLE = {"head_dim", "intermediate_size", "decoder_sparse_step", "partial_rotary_factor",
             "dtype", "torch_dtype", "mlp_only_layers", "layer_types", "rope_parameters",
             "rope_scaling", "tie_word_embeddings", "norm_topk_prob", "factor", "attention_factor",
             "beta_fast", "beta_slow", "original_max_position_embeddings"}
LAYER_TYPES = ("linear_attention", "full_attention")


def _shown(v: Any) -> str:
  if isinstance(v, str):
    return f"the string {json.dumps(v)}"
  kind = {bool: "a boolean", int: "an integer", float: "a number", list: "a list", dict: "an object",
          type(None): "null"}.get(type(v), type(v).__name__)
  return f"{json.dumps(v)[:60]} ({kind})" if v is not None else "null"


def config_type_errors(d: dict[str, Any], where: str = "") -> list[str]:
  """One message per field of an HF text config whose JSON type is wrong (`where` prefixes names)."""
  errs: list[str] = []

  def bad(name: str, want: str, v: Any) -> None:
    errs.append(f"field '{where}{name}' must be {want}, got {_shown(v)}")

  for name, v in d.items():
    if v is None:
      if name in _NULLABLE or name not in (_INT_FIELDS + _FLOAT_FIELDS + _BOOL_FIELDS):
        continue
      bad(name, "given (not null)", v)
    elif name in _INT_FIELDS and (isinstance(v, bool) or not isinstance(v, int)):
      bad(name, "an integer", v)
    elif name in _FLOAT_FIELDS and (isinstance(v, bool) or not isinstance(v, (int, float))):
      bad(name, "a number", v)
    elif name in _BOOL_FIELDS and not isinstance(v, bool):
      bad(name, "true or false", v)
    elif name in _STR_FIELDS and not isinstance(v, str):
      bad(name, "a string", v)
    elif name == "mlp_only_layers" and not (isinstance(v, list) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in v)):
      bad(name, "a list of layer indices", v)
    elif name == "layer_types" and not (isinstance(v, list) and all(x in LAYER_TYPES for x in v)):
      bad(name, f"a list of {' / '.join(LAYER_TYPES)}", v)
    elif name in ("rope_parameters", "rope_scaling"):
      if not isinstance(v, dict):
        bad(name, "an object", v)
      else:
        errs += config_type_errors({k: v[k] for k in _ROPE_CHECKED if k in v}, f"{where}{name}.")
  return errs


def read_config(path: str, **overrides: Any) -> ModelConfig:
  """The ModelConfig of an HF folder (flat, or nested under `text_config`). A field of the wrong
  JSON type (e.g. `"tie_word_embeddings": "false"`) is a CheckpointError naming every such field."""
  cfg_path = os.path.join(path, CONFIG)
  hf = read_json(cfg_path)
  if not isinstance(hf, dict):
    raise CheckpointError(f"{cfg_path}: expected a JSON object, got {_shown(hf)}")
  errs = []
  if "text_config" in hf:
    text = hf["text_config"]
    if not isinstance(text, dict):
      errs.append(f"field 'text_config' must be an object, got {_shown(text)}")
    else:
      errs += config_type_errors(text, "text_config.")
    errs += config_type_errors({k: hf[k] for k in ("tie_word_embeddings", "model_type")
                                if k in hf})
  else:
    errs += config_type_errors(hf)
  if errs:
    raise CheckpointError(f"{cfg_path}: " + "; ".join(errs))
  try:
    return from_hf_dict(hf, **overrides)
  except KeyError as e:
    raise CheckpointError(f"{cfg_path}: required field {e.args[0]!r} is missing") from None
  except (ValueError, TypeError) as e:
    raise CheckpointError(f"{cfg_path}: {e}") from None


_DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "f32": "float32",
                "bfloat16": "bfloat16", "bf16": "bfloat16"}


def dtype_name(dtype: Any) -> str | None:
  """"float32" | "bfloat16" for a name ("bf16", "float32", ...), a numpy dtype (ml_dtypes'
  bfloat16 included) or a jnp scalar type; None stays None."""
  if dtype is None:
    return None
  name = None
  if isinstance(dtype, str):
    name = _DTYPE_NAMES.get(dtype.strip().lower())
  else:
    try:
      name = _DTYPE_NAMES.get(np.dtype(dtype).name)
    except TypeError:
      pass
  if name is None:
    raise CheckpointError(f"load_pretrained: dtype {dtype!r} is not float32 or bfloat16 (give e.g. "
                          "jnp.float32, np.dtype('bfloat16'), 'bf16' or 'float32')")
  return name


def _checkpoint_dtype(path: str) -> str:
  hf = read_json(os.path.join(path, CONFIG))
  for d in (hf.get("text_config") or {}, hf):
    name = d.get("dtype") or d.get("torch_dtype")
    if name in ("float32", "bfloat16"):
      return name
  return "float32"


class _Checkpoint:
  """Tensor name -> (file, shape) over one file or an index of shards; memory-mapped reads."""

  def __init__(self, path: str, stack: contextlib.ExitStack):
    self.path = path
    index_path, single = os.path.join(path, INDEX), os.path.join(path, SINGLE)
    if os.path.exists(index_path):
      wm = read_json(index_path).get("weight_map")
      if not isinstance(wm, dict):
        raise CheckpointError(f"{index_path}: no 'weight_map' object")
      files = sorted(set(wm.values()))
    elif os.path.exists(single):
      files = [SINGLE]
    else:
      listing = sorted(os.listdir(path)) if os.path.isdir(path) else "not a directory"
      raise CheckpointError(f"{path}: neither {SINGLE} nor {INDEX} found (contents: {listing})")
    self.handles: dict[str, Any] = {}
    self.where: dict[str, str] = {}
    self.shapes: dict[str, tuple[int, ...]] = {}
    for fn in files:
      full = os.path.join(path, fn)
      if not os.path.exists(full):
        raise CheckpointError(f"{index_path}: lists shard {fn}, which does not exist")
      try:
        h = stack.enter_context(safe_open(full, framework="numpy"))
        names = list(h.keys())
        shapes = {n: tuple(h.get_slice(n).get_shape()) for n in names}
      except Exception as e:  # safetensors raises its own error type for bad headers
        raise CheckpointError(f"{full}: not a readable safetensors file "
                              f"(truncated or corrupted?): {e}") from None
      self.handles[fn] = h
      for n in names:
        if n in self.where:
          raise CheckpointError(f"{full}: tensor {n} also appears in {self.where[n]}")
        self.where[n] = fn
        self.shapes[n] = shapes[n]

  def file(self, key: str) -> str:
    return os.path.join(self.path, self.where[key])

  def read(self, key: str, slices: tuple | None = None) -> np.ndarray:
    h = self.handles[self.where[key]]
    try:
      return h.get_slice(key)[slices] if slices is not None else h.get_tensor(key)
    except Exception as e:
      raise CheckpointError(f"{self.file(key)}: cannot read tensor {key}: {e}") from None


def _detect_prefix(names: Iterator[str]) -> str:
  return RELEASED_PREFIX if any(n.startswith(RELEASED_PREFIX) for n in names) else TEXT_PREFIX


def _detect_expert_layout(names: list[str], path: str) -> str:
  """From the text model's own tensors: released Qwen3.5 checkpoints store the main layers' experts
  fused and the MTP layer's per expert, so `mtp.*` (and `model.visual.*`) are not looked at."""
  names = [n for n in names if not n.startswith(SKIPPED_PREFIXES)]
  fused = any(n.endswith(".mlp.experts.gate_up_proj") for n in names)
  per = any(".mlp.experts.0." in n for n in names)
  if fused and per:
    raise CheckpointError(f"{path}: mixes fused (gate_up_proj) and per-expert expert tensors")
  return "fused" if fused else "per_expert"


# ------------------------------------------------------------------------------------ integrity
CHECKSUMS = "checksums.json"
SKIP_CHECKSUMS_ENV = "LWM_SKIP_CHECKSUMS"


def write_checksums(path: str) -> str:
  """Records the size and SHA-256 of every file of the HF folder `path` in `checksums.json`
  (every export writes it; call it again after adding or changing a file)."""
  from lwm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  return checkpoints.write_checksums(path)


def verify_checksums(path: str, verify: bool | None = None) -> bool:
  """True when the folder's `checksums.json` matches its files; False when it has none (a folder
  made elsewhere) or checking is switched off (`verify=False`, or LWM_SKIP_CHECKSUMS=1). A
  changed, truncated or missing file is a CheckpointError naming it and the way to skip."""
  if verify is None:
    verify = os.environ.get(SKIP_CHECKSUMS_ENV, "") in ("", "0")
  if not verify:
    return False
  from lwm_jax import checkpoints  # pylint: disable=import-outside-toplevel
  try:
    return checkpoints.verify_step(path)
  except CheckpointError as e:
    raise CheckpointError(f"{e}. The folder is damaged or was changed after its export; if the "
                          f"change is yours, rewrite {CHECKSUMS} (hf.write_checksums) or load it "
                          f"unverified with {SKIP_CHECKSUMS_ENV}=1") from None


_verify = verify_checksums


def _check_finite(arr: np.ndarray, key: str, where: str) -> None:
  if arr.dtype.kind == "f" or arr.dtype.name == "bfloat16":
    finite = np.isfinite(arr.astype(np.float32) if arr.dtype.kind != "f" else arr)
    if not finite.all():
      raise CheckpointError(f"{where}: tensor {key} holds {int((~finite).sum())} non-finite "
                            "values (NaN or inf): the file is damaged")


# ------------------------------------------------------------------------------------------- load
def load_pretrained(path: str, dtype: str | None = None, mesh: jax.sharding.Mesh | None = None,
                    rules=None, verify_checksums: bool | None = None,
                    **config_overrides: Any) -> Transformer:
  """Loads an HF folder into a `Transformer`.

  dtype: parameter and compute dtype, float32 or bfloat16, as a name ("bf16", "float32"), a numpy
    dtype or a jnp type; default the checkpoint's own.
  mesh / rules: place each parameter straight into its NamedSharding (`sharding.state_shardings`).
  verify_checksums: check the folder's checksums.json first (default: yes, unless
    LWM_SKIP_CHECKSUMS=1); a folder without one loads with a warning. Every tensor is checked
    for NaN and inf either way.
  config_overrides: our ModelConfig fields (e.g. moe_backend="dense").
  """
  if os.path.isdir(path) and not _verify(path, verify_checksums):
    log.warning("%s: no %s (a folder made elsewhere, or checking is off); loading it "
                "unverified", path, CHECKSUMS)
  dtype = dtype_name(dtype) or _checkpoint_dtype(path)
  cfg = read_config(path, **{"dtype": dtype, "param_dtype": dtype, **config_overrides})
  graphdef, abs_state = abstract_model(cfg)
  flat = list(nnx.to_flat_state(abs_state))
  rules = rules or shd.DEFAULT_RULES
  with contextlib.ExitStack() as stack:
    ck = _Checkpoint(path, stack)
    names = list(ck.shapes)
    prefix = _detect_prefix(iter(names))
    layout = _detect_expert_layout(names, path)
    targets = {t.path: t for t in _targets(cfg, prefix, layout)}
    _check_coverage(targets, flat)
    used: set[str] = set()
    filled = []
    for p, var in flat:
      t = targets[p]
      shape = tuple(var.shape)
      for key, want in zip(t.keys, _hf_shapes(t, shape)):
        if key not in ck.shapes:
          raise CheckpointError(f"{path}: missing tensor {key} (expected shape {list(want)}) "
                                f"for model parameter {_dotted(p)}")
        if ck.shapes[key] != want:
          raise CheckpointError(f"{ck.file(key)}: tensor {key} has shape {list(ck.shapes[key])}, "
                                f"expected {list(want)} for model parameter {_dotted(p)} "
                                f"{list(shape)}")
        used.add(key)
      raw = _to_model(t, ck.read, shape)
      _check_finite(np.asarray(raw), ", ".join(t.keys), ck.file(t.keys[0]))
      host = np.asarray(raw, dtype=var.dtype)
      if mesh is not None:
        axes = var.get_metadata().get("axes") or (None,) * len(shape)
        s = NamedSharding(mesh, shd.spec_for(axes, shape, mesh, rules))
        value = jax.make_array_from_callback(shape, s, lambda idx, h=host: h[idx])
      else:
        value = jax.device_put(host)
      del host
      filled.append((p, var.replace(value)))
    _check_leftovers(ck, set(names) - used, cfg)
  return nnx.merge(graphdef, nnx.from_flat_state(filled))


def _dotted(path: tuple) -> str:
  return ".".join(str(x) for x in path)


def _check_coverage(targets: dict[tuple, _Target], flat: list) -> None:
  paths = {p for p, _ in flat}
  extra, missing = sorted(map(_dotted, paths - set(targets))), sorted(
      map(_dotted, set(targets) - paths))
  if extra or missing:  # the model and this table disagree: a code error, not a checkpoint one
    raise AssertionError(f"hf mapping out of date: model params without tensors {extra[:5]}, "
                         f"mapped params absent from the model {missing[:5]}")


def _check_leftovers(ck: _Checkpoint, left: set[str], cfg: ModelConfig) -> None:
  skipped = {p: sorted(n for n in left if n.startswith(p)) for p in SKIPPED_PREFIXES}
  n_skip = sum(len(v) for v in skipped.values())
  tied_head = "lm_head.weight" in left and cfg.tie_word_embeddings
  rest = sorted(n for n in left if not n.startswith(SKIPPED_PREFIXES) and
                not (tied_head and n == "lm_head.weight"))
  if rest:
    shown = ", ".join(f"{n} {list(ck.shapes[n])} in {ck.where[n]}" for n in rest[:5])
    more = f" (and {len(rest) - 5} more)" if len(rest) > 5 else ""
    raise CheckpointError(f"{ck.path}: {len(rest)} unexpected tensor(s) the model has no place "
                          f"for: {shown}{more}")
  if n_skip or tied_head:
    parts = [f"{len(v)} {p}*" for p, v in skipped.items() if v]
    if tied_head:
      parts.append("lm_head.weight (embeddings are tied)")
    log.info("load_pretrained %s: skipped %d tensor(s) not used by the text model: %s",
             ck.path, n_skip + int(tied_head), ", ".join(parts))


# ------------------------------------------------------------------------------------------- save
def _to_host(x: jax.Array) -> np.ndarray:
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x))


def _hf_tensors(model: Transformer, targets: list[_Target]) -> Iterator[tuple[str, Callable]]:
  """(HF name, producer of its numpy array) in model order; one parameter fetched per call."""
  state = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
  get = lambda p: _to_host(state[p][...])
  pending_gate: dict[str, tuple] = {}
  for t in targets:
    k = t.keys
    if t.kind == "same":
      yield k[0], lambda p=t.path: get(p)
    elif t.kind == "t":
      yield k[0], lambda p=t.path: np.ascontiguousarray(get(p).T)
    elif t.kind == "conv":
      yield k[0], lambda p=t.path: get(p)[:, None, :]
    elif t.kind == "experts_t":
      cache: dict[str, np.ndarray] = {}

      def one(e: int, p=t.path, cache=cache, n=len(k)) -> np.ndarray:
        if "w" not in cache:
          cache["w"] = get(p)
        w = cache["w"][e]
        if e == n - 1:
          cache.clear()
        return np.ascontiguousarray(w.T)
      for e, key in enumerate(k):
        yield key, lambda e=e, one=one: one(e)
    elif t.kind == "fused_gate":
      pending_gate[k[0]] = t.path
    elif t.kind == "fused_up":
      g = pending_gate.pop(k[0])
      yield k[0], lambda g=g, u=t.path: np.ascontiguousarray(
          np.concatenate([get(g), get(u)], axis=2).transpose(0, 2, 1))
    elif t.kind == "fused_down":
      yield k[0], lambda p=t.path: np.ascontiguousarray(get(p).transpose(0, 2, 1))


def save_pretrained(model: Transformer, path: str, expert_layout: str = "per_expert",
                    released_layout: bool = False, max_shard_bytes: int = 4 * 2**30,
                    tokenizer: Any = None, generation: Any = None) -> list[str]:
  """Writes `config.json`, safetensors (several shards + index past `max_shard_bytes`) and
  `generation_config.json`; with `tokenizer` (object or path) also the tokenizer files
  (`hf_tokenizer.save_tokenizer`), so that the folder can be served as it is.

  expert_layout: "per_expert" (what HF `save_pretrained` writes) or "fused" (released Qwen3.5).
  released_layout: Qwen3.5 only: config nested under `text_config` (model_type qwen3_5_moe) and
    tensors under `model.language_model.`, as the released checkpoints.
  Tensors are written in the config's param_dtype (fp32 norm scales of a bf16 model are cast).
  generation: sampling defaults for generation_config.json (`hf_tokenizer.generation_config`).
  Returns the safetensors file names written. Only process 0 writes.
  """
  cfg: ModelConfig = model.cfg
  if expert_layout not in EXPERT_LAYOUTS:
    raise ValueError(f"save_pretrained: expert_layout {expert_layout!r} not in {EXPERT_LAYOUTS}")
  if released_layout and not cfg.is_hybrid:
    raise ValueError("save_pretrained: released_layout is only defined for Qwen3.5-MoE models")
  prefix = RELEASED_PREFIX if released_layout else TEXT_PREFIX
  targets = _targets(cfg, prefix, expert_layout)
  _check_coverage({t.path: t for t in targets},
                  list(nnx.to_flat_state(nnx.state(model, nnx.Param))))
  hf_cfg = to_hf_dict(cfg)
  hf_cfg.setdefault("dtype", cfg.param_dtype)
  if released_layout:
    tie = hf_cfg.pop("tie_word_embeddings")
    hf_cfg.pop("architectures", None)
    hf_cfg = {"architectures": ["Qwen3_5MoeForConditionalGeneration"],
              "model_type": "qwen3_5_moe", "text_config": hf_cfg, "tie_word_embeddings": tie}
  writer = jax.process_index() == 0
  if writer:
    os.makedirs(path, exist_ok=True)
    for fn in os.listdir(path):  # stale shards of an earlier save would confuse a loader
      if fn.endswith(".safetensors") or fn == INDEX:
        os.remove(os.path.join(path, fn))
    with open(os.path.join(path, CONFIG), "w") as f:
      json.dump(hf_cfg, f, indent=2)
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  files: list[str] = []
  weight_map: dict[str, str] = {}
  total = 0

  def flush() -> None:
    nonlocal size
    if not shards[-1]:
      return
    fn = f"part-{len(files):05d}.safetensors"
    if writer:
      save_file(shards[-1], os.path.join(path, fn), metadata={"format": "pt"})
    files.append(fn)
    for k in shards[-1]:
      weight_map[k] = fn
    shards[-1] = {}
    size = 0

  out_dtype = np.dtype(DTYPES[cfg.param_dtype])
  for key, produce in _hf_tensors(model, targets):
    arr = produce()  # every process takes part in gathering a sharded parameter
    if arr.dtype != out_dtype:  # e.g. fp32 norm scales of a bf16 model: one dtype per checkpoint
      arr = arr.astype(out_dtype)
    if size and size + arr.nbytes > max_shard_bytes:
      flush()
    shards[-1][key] = arr
    size += arr.nbytes
    total += arr.nbytes
  flush()
  names = [SINGLE] if len(files) == 1 else [
      f"model-{i + 1:05d}-of-{len(files):05d}.safetensors" for i in range(len(files))]
  if writer:
    for old, new in zip(files, names):
      os.replace(os.path.join(path, old), os.path.join(path, new))
    if len(files) > 1:
      rename = dict(zip(files, names))
      index = {"metadata": {"total_size": total},
               "weight_map": {k: rename[v] for k, v in sorted(weight_map.items())}}
      with open(os.path.join(path, INDEX), "w") as f:
        json.dump(index, f, indent=2)
    if tokenizer is not None:
      hf_tokenizer.save_tokenizer(tokenizer, path)
    else:
      log.warning("save_pretrained %s: no tokenizer given; serving this folder needs --tokenizer",
                  path)
    with open(os.path.join(path, hf_tokenizer.GENERATION_CONFIG), "w") as f:
      json.dump(hf_tokenizer.generation_config(tokenizer, generation), f, indent=2)
    write_checksums(path)
  return names
