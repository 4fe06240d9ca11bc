"""Model configuration with Hugging Face field names, and the named presets.

One `ModelConfig` covers both families: Qwen3-MoE (`model_type="qwen3_moe"`) and the hybrid
Qwen3.5-MoE text model (`model_type="qwen3_5_moe_text"`). Field names follow `transformers` so that a
`config.json` maps onto it directly (see `from_hf_dict`); fields after the marked line are ours.
"""
from __future__ import annotations

import dataclasses
from typing import Any

QWEN3_MOE = "qwen3_moe"
QWEN35_MOE = "qwen3_5_moe_text"
NORM_BACKWARDS = ("auto", "xla", "written")
ATTENTION_BACKWARDS = ("auto", "stored", "recomputed")
MOE_BACKENDS = ("auto", "ragged_dot", "gmm", "tiled", "blocked", "capacity", "sorted", "dense")


@dataclasses.dataclass
class ModelConfig:
  model_type: str = QWEN3_MOE
  vocab_size: int = 151936
  hidden_size: int = 2048
  intermediate_size: int = 6144          # dense SwiGLU layers (mlp_only_layers / sparse step)
  moe_intermediate_size: int = 768
  num_hidden_layers: int = 48
  num_attention_heads: int = 32
  num_key_value_heads: int = 4
  head_dim: int = 128
  num_experts: int = 128
  num_experts_per_tok: int = 8
  norm_topk_prob: bool = True
  decoder_sparse_step: int = 1
  mlp_only_layers: tuple[int, ...] = ()
  rms_norm_eps: float = 1e-6
  rope_theta: float = 1e6
  max_position_embeddings: int = 40960
  # RoPE scaling as HF spells it (`rope_parameters` / `rope_scaling` less `rope_theta` and
  # `partial_rotary_factor`): None for plain RoPE, else {"rope_type": "linear" | "yarn",
  # "factor": ..., and for yarn optionally "original_max_position_embeddings", "attention_factor",
  # "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate"}
  rope_scaling: dict[str, Any] | None = None
  tie_word_embeddings: bool = False
  router_aux_loss_coef: float = 0.001
  # Qwen3.5-MoE (hybrid) fields; ignored by qwen3_moe.
  layer_types: tuple[str, ...] | None = None   # "full_attention" | "linear_attention" per layer
  full_attention_interval: int = 4
  partial_rotary_factor: float = 1.0
  shared_expert_intermediate_size: int = 0
  linear_num_key_heads: int = 16
  linear_num_value_heads: int = 32
  linear_key_head_dim: int = 128
  linear_value_head_dim: int = 128
  linear_conv_kernel_dim: int = 4
  # ---- ours (not in HF configs) ----
  router_z_loss_coef: float = 0.0
  moe_backend: str = "auto"            # auto | ragged_dot | gmm | tiled | blocked | capacity | sorted | dense
  capacity_factor: float = 1.25        # for moe_backend="capacity"
  sorted_capacity_factor: float = 2.0  # for moe_backend="sorted"; drops are counted
  ep_capacity_factor: float = 0.0      # expert-parallel send buffers; 0 = dropless (worst case)
  # > 0: a device's tokens go through the MoE this many at a time, each chunk rematerialised in
  # the backward pass: the dispatch buffers ([tokens x top_k, hidden] several times over) are
  # held for one chunk, not the whole row, for one more forward pass of the experts. 0: at once
  moe_chunk_tokens: int = 0
  dtype: str = "float32"               # compute dtype
  param_dtype: str = "float32"
  remat: bool = False                  # rematerialise each block in the backward pass
  # Run the layers (without a cache) as one `lax.scan` over their parameters stacked per period
  # of identical layers (1 for Qwen3-MoE, full_attention_interval for the hybrid): the compiled
  # program holds one period's body, so compile time stays flat in depth (MaxText's
  # scan_layers). Parameters stay stored per layer (HF import/export and checkpoints unchanged);
  # the stack is taken inside the step. Same values as the unrolled loop.
  scan_layers: bool = False
  linear_attn_chunk_size: int = 64
  # RMSNorm / L2-norm gradients: "xla" (XLA's autodiff), "written" (layers.normalize_rows and
  # scale_channels: the sums as products with ones), "auto" (written for the hybrid, where it was
  # measured faster at 1 x 2048; XLA's elsewhere, faster at the demo's CPT shape). Same values.
  norm_backward: str = "auto"
  # Training attention's backward pass: "stored" (XLA differentiates the chunked attention and
  # keeps every chunk's probabilities), "recomputed" (attention.recomputed_causal_attention: only
  # the output and log-partition kept, scores recomputed; O(chunk x S) memory), "auto"
  # (recomputed where the step is built for a TPU or GPU, stored on CPU). Same values.
  attention_backward: str = "auto"

  # ------------------------------------------------------------------ derived
  @property
  def is_hybrid(self) -> bool:
    return self.model_type == QWEN35_MOE

  def layer_type(self, i: int) -> str:
    if not self.is_hybrid:
      return "full_attention"
    if self.layer_types is not None:
      return self.layer_types[i]
    return "full_attention" if (i + 1) % self.full_attention_interval == 0 else "linear_attention"

  def is_moe_layer(self, i: int) -> bool:
    if self.is_hybrid:
      return True
    return (i not in self.mlp_only_layers and self.num_experts > 0
            and (i + 1) % self.decoder_sparse_step == 0)

  @property
  def written_norms(self) -> bool:
    """Whether the norms take their written-out backward passes (see `norm_backward`)."""
    return self.norm_backward == "written" or (self.norm_backward == "auto" and self.is_hybrid)

  @property
  def rope_scaling_items(self) -> tuple[tuple[str, Any], ...] | None:
    """`rope_scaling` as sorted (field, value) pairs (hashable, for the modules' static state)."""
    return tuple(sorted(self.rope_scaling.items())) if self.rope_scaling else None

  @property
  def rotary_dim(self) -> int:
    d = int(self.head_dim * self.partial_rotary_factor)
    return d - d % 2

  def validate(self) -> "ModelConfig":
    """Raises ValueError naming the first inconsistent field."""
    def need(cond: bool, field: str, why: str):
      if not cond:
        raise ValueError(f"model.{field}: {why}")
    need(self.model_type in (QWEN3_MOE, QWEN35_MOE), "model_type",
         f"'{self.model_type}' is not one of {QWEN3_MOE}, {QWEN35_MOE}")
    for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim"):
      need(getattr(self, f) > 0, f, "must be positive")
    need(self.num_attention_heads % self.num_key_value_heads == 0, "num_key_value_heads",
         f"{self.num_key_value_heads} does not divide num_attention_heads={self.num_attention_heads}")
    need(0 < self.num_experts_per_tok <= max(self.num_experts, 1), "num_experts_per_tok",
         f"{self.num_experts_per_tok} must be in [1, num_experts={self.num_experts}]")
    need(self.moe_backend in MOE_BACKENDS, "moe_backend",
         f"'{self.moe_backend}' is not one of {MOE_BACKENDS}")
    need(self.norm_backward in NORM_BACKWARDS, "norm_backward",
         f"'{self.norm_backward}' is not one of {NORM_BACKWARDS}")
    need(self.attention_backward in ATTENTION_BACKWARDS, "attention_backward",
         f"'{self.attention_backward}' is not one of {ATTENTION_BACKWARDS}")
    need(self.capacity_factor > 0, "capacity_factor", "must be positive")
    need(self.sorted_capacity_factor > 0, "sorted_capacity_factor", "must be positive")
    need(self.moe_chunk_tokens >= 0, "moe_chunk_tokens", "must be 0 (all at once) or positive")
    need(self.dtype in ("float32", "bfloat16", "float16"), "dtype", f"unknown dtype {self.dtype}")
    need(self.param_dtype in ("float32", "bfloat16"), "param_dtype", f"unknown {self.param_dtype}")
    if self.layer_types is not None:
      need(len(self.layer_types) == self.num_hidden_layers, "layer_types",
           f"has {len(self.layer_types)} entries for num_hidden_layers={self.num_hidden_layers}")
      bad = [t for t in self.layer_types if t not in ("full_attention", "linear_attention")]
      need(not bad, "layer_types", f"unknown layer type {bad[:1]}")
    if self.is_hybrid:
      need(self.linear_num_value_heads % self.linear_num_key_heads == 0, "linear_num_value_heads",
           "must be a multiple of linear_num_key_heads")
      need(0 < self.partial_rotary_factor <= 1, "partial_rotary_factor", "must be in (0, 1]")
    if self.rope_scaling is not None:
      check_rope_scaling(self.rope_scaling, "model.rope_scaling")
    bad_dense = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
    need(not bad_dense, "mlp_only_layers", f"layer indices {bad_dense} out of range")
    return self

  def replace(self, **kw: Any) -> "ModelConfig":
    return dataclasses.replace(self, **kw)

  def to_dict(self) -> dict[str, Any]:
    d = dataclasses.asdict(self)
    d["mlp_only_layers"] = list(self.mlp_only_layers)
    if self.layer_types is not None:
      d["layer_types"] = list(self.layer_types)
    return d

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - names)
    if unknown:
      raise ValueError(f"unknown model config fields: {unknown}")
    d = dict(d)
    if "mlp_only_layers" in d:
      d["mlp_only_layers"] = tuple(d["mlp_only_layers"] or ())
    if d.get("layer_types") is not None:
      d["layer_types"] = tuple(d["layer_types"])
    return cls(**d)


ROPE_SCALING_TYPES = ("linear", "yarn")
# the fields each scaling reads; others in the dict are left out of ModelConfig.rope_scaling
_ROPE_FIELDS = {"linear": ("factor",),
                "yarn": ("factor", "original_max_position_embeddings", "attention_factor",
                         "beta_fast", "beta_slow", "mscale", "mscale_all_dim", "truncate")}


def check_rope_scaling(sc: dict[str, Any], where: str) -> None:
  """ValueError naming `where` when a scaling dict has an unknown type or lacks / misuses a field."""
  kind = sc.get("rope_type")
  if kind not in ROPE_SCALING_TYPES:
    raise ValueError(f"{where}.rope_type: '{kind}' is not supported (supported: default, "
                     f"{', '.join(ROPE_SCALING_TYPES)})")
  extra = sorted(set(sc) - {"rope_type"} - set(_ROPE_FIELDS[kind]))
  if extra:
    raise ValueError(f"{where}: fields {extra} do not apply to rope_type '{kind}'")
  f = sc.get("factor")
  if f is None and kind == "yarn" and sc.get("original_max_position_embeddings"):
    return   # the factor is max_position_embeddings / original_max_position_embeddings
  if isinstance(f, bool) or not isinstance(f, (int, float)) or f < 1:
    raise ValueError(f"{where}.factor: must be a number >= 1 for rope_type '{kind}', got {f!r}")


def rope_scaling_from_hf(rope: dict[str, Any], where: str) -> dict[str, Any] | None:
  """ModelConfig.rope_scaling from an HF `rope_parameters` / `rope_scaling` dict (the older
  spelling `type` is read too); None for the default type. An unknown type is a ValueError
  naming `where` and the type."""
  kind = rope.get("rope_type", rope.get("type", "default"))
  if kind == "default":
    return None
  if kind not in ROPE_SCALING_TYPES:
    raise ValueError(f"config.json: {where}.rope_type '{kind}' is not supported by lwm_jax "
                     f"(supported: default, {', '.join(ROPE_SCALING_TYPES)})")
  out = {"rope_type": kind}
  out.update({k: rope[k] for k in _ROPE_FIELDS[kind] if rope.get(k) is not None})
  check_rope_scaling(out, f"config.json: {where}")
  return out


def from_hf_dict(hf: dict[str, Any], **overrides: Any) -> ModelConfig:
  """Maps a Hugging Face `config.json` (either family, nested `text_config` or flat) to ModelConfig."""
  if "text_config" in hf and isinstance(hf["text_config"], dict):
    outer_tie = hf.get("tie_word_embeddings")
    hf = dict(hf["text_config"])
    if outer_tie is not None and "tie_word_embeddings" not in hf:
      hf["tie_word_embeddings"] = outer_tie
  mt = hf.get("model_type", QWEN3_MOE)
  if mt in ("qwen3_5_moe", "qwen3_5_moe_text"):
    mt = QWEN35_MOE
  elif mt != QWEN3_MOE:
    raise ValueError(f"config.json: model_type '{mt}' is not supported "
                     f"(expected qwen3_moe, qwen3_5_moe or qwen3_5_moe_text)")
  # transformers reads `rope_scaling` first when both are given
  rope_key = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
  rope = dict(hf.get(rope_key) or {})
  if hf.get("original_max_position_embeddings"):   # a top-level one wins, as in transformers
    rope["original_max_position_embeddings"] = hf["original_max_position_embeddings"]
  theta = hf.get("rope_theta", rope.get("rope_theta", 10000.0))
  prf = hf.get("partial_rotary_factor", rope.get("partial_rotary_factor"))
  if prf is None:
    prf = 0.25 if mt == QWEN35_MOE else 1.0
  kw: dict[str, Any] = dict(
      model_type=mt,
      vocab_size=hf["vocab_size"],
      hidden_size=hf["hidden_size"],
      intermediate_size=hf.get("intermediate_size", 0) or 0,
      moe_intermediate_size=hf["moe_intermediate_size"],
      num_hidden_layers=hf["num_hidden_layers"],
      num_attention_heads=hf["num_attention_heads"],
      num_key_value_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
      head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
      num_experts=hf.get("num_experts", hf.get("num_local_experts", 0)),
      num_experts_per_tok=hf["num_experts_per_tok"],
      norm_topk_prob=bool(hf.get("norm_topk_prob", mt == QWEN35_MOE)),
      decoder_sparse_step=hf.get("decoder_sparse_step", 1) or 1,
      mlp_only_layers=tuple(hf.get("mlp_only_layers") or ()),
      rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
      rope_theta=float(theta),
      max_position_embeddings=hf.get("max_position_embeddings", 32768),
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      router_aux_loss_coef=hf.get("router_aux_loss_coef", 0.001),
      partial_rotary_factor=float(prf),
      rope_scaling=rope_scaling_from_hf(rope, rope_key),
  )
  if mt == QWEN35_MOE:
    kw.update(
        norm_topk_prob=True,
        layer_types=tuple(hf["layer_types"]) if hf.get("layer_types") else None,
        full_attention_interval=hf.get("full_attention_interval", 4),
        shared_expert_intermediate_size=hf.get("shared_expert_intermediate_size", 0),
        linear_num_key_heads=hf["linear_num_key_heads"],
        linear_num_value_heads=hf["linear_num_value_heads"],
        linear_key_head_dim=hf["linear_key_head_dim"],
        linear_value_head_dim=hf["linear_value_head_dim"],
        linear_conv_kernel_dim=hf.get("linear_conv_kernel_dim", 4),
    )
  kw.update(overrides)
  return ModelConfig(**kw).validate()


def to_hf_dict(cfg: ModelConfig) -> dict[str, Any]:
  """The `config.json` that `transformers` reads for this model (flat text config)."""
  rope = {"rope_type": "default", **(cfg.rope_scaling or {}), "rope_theta": cfg.rope_theta}
  d: dict[str, Any] = dict(
      model_type=cfg.model_type, vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
      moe_intermediate_size=cfg.moe_intermediate_size,
      num_hidden_layers=cfg.num_hidden_layers, num_attention_heads=cfg.num_attention_heads,
      num_key_value_heads=cfg.num_key_value_heads, head_dim=cfg.head_dim,
      num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
      rms_norm_eps=cfg.rms_norm_eps, max_position_embeddings=cfg.max_position_embeddings,
      tie_word_embeddings=cfg.tie_word_embeddings, router_aux_loss_coef=cfg.router_aux_loss_coef,
      hidden_act="silu", attention_bias=False, dtype=cfg.param_dtype,
  )
  if cfg.is_hybrid:
    d.update(
        architectures=["Qwen3_5MoeForCausalLM"],
        rope_parameters={**rope, "partial_rotary_factor": cfg.partial_rotary_factor},
        layer_types=[cfg.layer_type(i) for i in range(cfg.num_hidden_layers)],
        shared_expert_intermediate_size=cfg.shared_expert_intermediate_size,
        linear_num_key_heads=cfg.linear_num_key_heads,
        linear_num_value_heads=cfg.linear_num_value_heads,
        linear_key_head_dim=cfg.linear_key_head_dim,
        linear_value_head_dim=cfg.linear_value_head_dim,
        linear_conv_kernel_dim=cfg.linear_conv_kernel_dim)
  else:
    d.update(
        architectures=["Qwen3MoeForCausalLM"],
        intermediate_size=cfg.intermediate_size, norm_topk_prob=cfg.norm_topk_prob,
        decoder_sparse_step=cfg.decoder_sparse_step, mlp_only_layers=list(cfg.mlp_only_layers),
        rope_theta=cfg.rope_theta, rope_parameters=rope)
  if cfg.rope_scaling:
    # the older spelling, for transformers releases that read only `rope_scaling`
    d["rope_scaling"] = dict(rope)
  return d


# ---------------------------------------------------------------------------- presets
def _tiny() -> ModelConfig:
  return ModelConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                     moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                     rope_theta=1e4, max_position_embeddings=2048)


def _small() -> ModelConfig:
  # The CPU benchmark shape (docs/models.md, "The CPU reference size").
  return ModelConfig(vocab_size=32000, hidden_size=512, intermediate_size=1024,
                     moe_intermediate_size=256, num_hidden_layers=8, num_attention_heads=8,
                     num_key_value_heads=2, head_dim=64, num_experts=16, num_experts_per_tok=4,
                     rope_theta=1e6, max_position_embeddings=4096)


def _moe_1b() -> ModelConfig:
  # The accelerator benchmark's shape (benchmarks/accelerator.sh): Qwen3-MoE layers at about 1.0B
  # active parameters per token (3.0B in all), Qwen3's vocabulary.
  return ModelConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                     moe_intermediate_size=1024, num_hidden_layers=12, num_attention_heads=16,
                     num_key_value_heads=4, head_dim=128, num_experts=32, num_experts_per_tok=8,
                     norm_topk_prob=True, rope_theta=1e6, max_position_embeddings=40960,
                     dtype="bfloat16")


def _qwen3_30b_a3b() -> ModelConfig:
  return ModelConfig(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                     moe_intermediate_size=768, num_hidden_layers=48, num_attention_heads=32,
                     num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                     norm_topk_prob=True, rope_theta=1e6, max_position_embeddings=40960,
                     dtype="bfloat16")


def _qwen35(layers, hidden, heads, lin_v_heads, experts, top_k, moe_i) -> ModelConfig:
  return ModelConfig(model_type=QWEN35_MOE, vocab_size=248320, hidden_size=hidden,
                     intermediate_size=0, moe_intermediate_size=moe_i, num_hidden_layers=layers,
                     num_attention_heads=heads, num_key_value_heads=2, head_dim=256,
                     num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=True,
                     shared_expert_intermediate_size=moe_i, linear_num_key_heads=16,
                     linear_num_value_heads=lin_v_heads, linear_key_head_dim=128,
                     linear_value_head_dim=128, linear_conv_kernel_dim=4,
                     full_attention_interval=4, partial_rotary_factor=0.25, rope_theta=1e7,
                     max_position_embeddings=262144, dtype="bfloat16")


def _tiny_hybrid() -> ModelConfig:
  return _tiny().replace(model_type=QWEN35_MOE, num_hidden_layers=4,
                         shared_expert_intermediate_size=32, linear_num_key_heads=2,
                         linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=16,
                         partial_rotary_factor=0.5)


def _small_hybrid() -> ModelConfig:
  # The `small` shape with Qwen3.5's hybrid layers (3 linear : 1 full) and a shared expert.
  return _small().replace(model_type=QWEN35_MOE, shared_expert_intermediate_size=256,
                          linear_num_key_heads=4, linear_num_value_heads=8,
                          linear_key_head_dim=64, linear_value_head_dim=64,
                          partial_rotary_factor=0.25, intermediate_size=0)


PRESETS = {
    "tiny": _tiny, "small": _small, "moe_1b": _moe_1b, "qwen3_30b_a3b": _qwen3_30b_a3b,
    "tiny_hybrid": _tiny_hybrid, "small_hybrid": _small_hybrid,
    "qwen35_35b_a3b": lambda: _qwen35(40, 2048, 16, 32, 256, 8, 512),
    "qwen35_397b_a17b": lambda: _qwen35(60, 4096, 32, 64, 512, 10, 1024),
}


def get_preset(name: str, **overrides: Any) -> ModelConfig:
  if name not in PRESETS:
    raise ValueError(f"unknown model preset '{name}' (known: {', '.join(sorted(PRESETS))})")
  return PRESETS[name]().replace(**overrides).validate()
