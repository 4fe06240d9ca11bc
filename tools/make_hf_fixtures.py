"""Writes tests/fixtures/hf/: tiny random Hugging Face checkpoints with reference logits and aux loss.

Needs the `hf` extra (torch CPU + transformers); the tests only read the files written here.
  .venv/bin/python tools/make_hf_fixtures.py [--only=rope]

Every case directory holds an HF checkpoint (config.json + safetensors) and `ref.npz` with
`input_ids` [B, S] int32, `logits` [B, S, V] float32 and `aux_loss` [] float32, computed by
`transformers` in float32 with eager attention and `output_router_logits=True`.

Cases (norm weights, and for Qwen3.5 also dt_bias / A_log, are perturbed away from their init so a
`w` vs `1 + w` mistake shows; weights use std 0.1 so that logits are not all near zero):
  q3_topk_norm          Qwen3-MoE, norm_topk_prob=True, 2 MoE layers, B=2 S=13, per-expert layout
  q3_dense_mid          norm_topk_prob=False, 3 layers with layer 1 dense (mlp_only_layers), B=2 S=7
  q3_dense_mid_fused    the same weights with fused experts (gate_up_proj / down_proj), split into
                        3 shards with model.safetensors.index.json, and the old config spellings
                        (`num_experts`, top-level `rope_theta`)
  q3_sparse_step_tied   decoder_sparse_step=2 (layer 0 dense), tied embeddings, B=1 S=9
  q3_rope_yarn          YaRN RoPE scaling, factor 2 over an original context of 128
                        (max_position_embeddings 256), head_dim 16, B=1 S=200 (positions past
                        the original context); config.json rewritten in the form lwm_jax's export
                        writes (top-level rope_theta, rope_parameters and a rope_scaling copy)
  q3_rope_yarn_fields   YaRN with every field given: factor 2, attention_factor 1.25,
                        beta_fast 16, beta_slow 2, truncate false, B=1 S=150
  q3_rope_linear        linear RoPE scaling, factor 2, in the older spelling (top-level
                        rope_theta, `rope_scaling: {"type": "linear", "factor": 2.0}`), B=2 S=40
  q35_per_expert        Qwen3.5-MoE text model (Qwen3_5MoeForCausalLM.save_pretrained): layers
                        [linear, full, linear], Dk=8 != Dv=12, Hk=2 -> Hv=4, head_dim 16 with
                        partial_rotary_factor 0.5, shared expert, B=1 S=150 (> two 64-chunks)
  q35_released          the same weights in the released on-disk layout: nested `text_config`
                        (model_type qwen3_5_moe), tensors under `model.language_model.`, fused experts
                        without `.weight`, dummy `model.visual.*` and `mtp.*` tensors, 2 shards + index
  q35_interval          Qwen3.5 with layer_types absent (full_attention_interval=2), default partial
                        rotary 0.25, B=2 S=70, released layout in one file
"""
from __future__ import annotations

import argparse
import json
import os
import shutil

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "hf")

Q3_BASE = dict(vocab_size=128, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=6,
               num_experts_per_tok=2, rope_theta=10000.0, rms_norm_eps=1e-6,
               max_position_embeddings=256, initializer_range=0.1)

Q35_BASE = dict(vocab_size=128, hidden_size=32, moe_intermediate_size=16,
                shared_expert_intermediate_size=24, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, num_experts=6, num_experts_per_tok=2, linear_num_key_heads=2,
                linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=512,
                initializer_range=0.1)


# ------------------------------------------------------------------------------------------ helpers
def _perturb(model: torch.nn.Module, gen: torch.Generator) -> None:
  """Moves norm weights (and DeltaNet dt_bias / A_log) away from their initial values."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
        p.add_(0.3 * torch.randn(p.shape, generator=gen))
      elif name.endswith("dt_bias"):
        p.copy_(torch.randn(p.shape, generator=gen))
      elif name.endswith("A_log"):
        p.copy_(torch.log(torch.rand(p.shape, generator=gen) * 4 + 0.5))


def _reference(model: torch.nn.Module, ids: np.ndarray) -> dict[str, np.ndarray]:
  assert model.config._attn_implementation == "eager", model.config._attn_implementation
  assert all(p.dtype == torch.float32 for p in model.parameters())
  model.eval()
  with torch.no_grad():
    out = model(input_ids=torch.from_numpy(ids).long(), output_router_logits=True)
  return {"input_ids": ids.astype(np.int32), "logits": out.logits.float().numpy(),
          "aux_loss": np.asarray(out.aux_loss.float().item(), np.float32)}


def _read_all(folder: str) -> dict[str, torch.Tensor]:
  out = {}
  for fn in sorted(os.listdir(folder)):
    if fn.endswith(".safetensors"):
      with safe_open(os.path.join(folder, fn), "pt") as f:
        for k in f.keys():
          out[k] = f.get_tensor(k)
  return out


def _write_shards(folder: str, tensors: dict[str, torch.Tensor], n_shards: int) -> None:
  """Writes tensors as `n_shards` files (+ index when more than one), in name order."""
  for fn in os.listdir(folder):
    if fn.endswith(".safetensors") or fn.endswith(".index.json"):
      os.remove(os.path.join(folder, fn))
  names = sorted(tensors)
  if n_shards == 1:
    save_file({k: tensors[k].contiguous() for k in names}, os.path.join(folder, "model.safetensors"),
              metadata={"format": "pt"})
    return
  groups = np.array_split(np.arange(len(names)), n_shards)
  weight_map, total = {}, 0
  for i, idx in enumerate(groups):
    fn = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
    part = {names[j]: tensors[names[j]].contiguous() for j in idx}
    save_file(part, os.path.join(folder, fn), metadata={"format": "pt"})
    for k, v in part.items():
      weight_map[k] = fn
      total += v.numel() * v.element_size()
  with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def _fuse_experts(tensors: dict[str, torch.Tensor], num_experts: int) -> dict[str, torch.Tensor]:
  """Per-expert `mlp.experts.{e}.{gate,up,down}_proj.weight` -> fused gate_up_proj / down_proj."""
  out, prefixes = {}, set()
  for k, v in tensors.items():
    if ".mlp.experts.0.gate_proj.weight" in k:
      prefixes.add(k[:-len("0.gate_proj.weight")])
    if ".mlp.experts." not in k:
      out[k] = v
  for p in sorted(prefixes):
    gate = torch.stack([tensors[f"{p}{e}.gate_proj.weight"] for e in range(num_experts)])
    up = torch.stack([tensors[f"{p}{e}.up_proj.weight"] for e in range(num_experts)])
    down = torch.stack([tensors[f"{p}{e}.down_proj.weight"] for e in range(num_experts)])
    out[p + "gate_up_proj"] = torch.cat([gate, up], dim=1)   # [E, 2I, D], gate rows first
    out[p + "down_proj"] = down                              # [E, D, I]
  return out


def _save_case(name: str, model: torch.nn.Module, ref: dict[str, np.ndarray]) -> str:
  folder = os.path.join(OUT, name)
  shutil.rmtree(folder, ignore_errors=True)
  model.save_pretrained(folder)
  for extra in ("generation_config.json",):
    if os.path.exists(os.path.join(folder, extra)):
      os.remove(os.path.join(folder, extra))
  np.savez(os.path.join(folder, "ref.npz"), **ref)
  return folder


def _copy_case(src: str, name: str) -> str:
  folder = os.path.join(OUT, name)
  shutil.rmtree(folder, ignore_errors=True)
  shutil.copytree(src, folder)
  return folder


def _check_reload(cls, folder: str, ref: dict[str, np.ndarray]) -> None:
  """transformers itself must load the written folder and give the same logits."""
  model = cls.from_pretrained(folder, attn_implementation="eager", dtype=torch.float32)
  got = _reference(model, ref["input_ids"])
  err = np.abs(got["logits"] - ref["logits"]).max()
  assert err < 1e-5, (folder, err)
  print(f"  {os.path.relpath(folder, OUT)}: transformers reload max |dlogits| = {err:.2e}")


def _ids(gen: torch.Generator, b: int, s: int, vocab: int) -> np.ndarray:
  return torch.randint(0, vocab, (b, s), generator=gen).numpy().astype(np.int32)


# --------------------------------------------------------------------------------------- Qwen3-MoE
def _qwen3(name: str, seed: int, b: int, s: int, **cfg_kw) -> tuple[str, torch.nn.Module, dict]:
  torch.manual_seed(seed)
  gen = torch.Generator().manual_seed(seed)
  cfg = Qwen3MoeConfig(**{**Q3_BASE, **cfg_kw}, attn_implementation="eager")
  model = Qwen3MoeForCausalLM(cfg).float()
  _perturb(model, gen)
  ref = _reference(model, _ids(gen, b, s, cfg.vocab_size))
  folder = _save_case(name, model, ref)
  print(f"{name}: logits {ref['logits'].shape} aux {float(ref['aux_loss']):.6f}")
  return folder, model, ref


def make_qwen3() -> None:
  _qwen3("q3_topk_norm", 1, 2, 13, num_hidden_layers=2, norm_topk_prob=True)
  src, _, ref = _qwen3("q3_dense_mid", 2, 2, 7, num_hidden_layers=3, norm_topk_prob=False,
                       mlp_only_layers=[1])
  _check_reload(Qwen3MoeForCausalLM, src, ref)
  fused = _copy_case(src, "q3_dense_mid_fused")
  tensors = _fuse_experts(_read_all(fused), Q3_BASE["num_experts"])
  _write_shards(fused, tensors, 3)
  with open(os.path.join(fused, "config.json")) as f:
    cfg = json.load(f)
  cfg["num_experts"] = cfg.pop("num_local_experts")          # the older spelling
  cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"]
  with open(os.path.join(fused, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
  _check_reload(Qwen3MoeForCausalLM, fused, ref)
  _qwen3("q3_sparse_step_tied", 3, 1, 9, num_hidden_layers=2, norm_topk_prob=True,
         decoder_sparse_step=2, tie_word_embeddings=True)
  make_qwen3_rope()


def _rewrite_rope(folder: str, **fields) -> None:
  """Replaces the rope fields of a saved config.json with `fields` (None removes one)."""
  path = os.path.join(folder, "config.json")
  with open(path) as f:
    cfg = json.load(f)
  for k in ("rope_theta", "rope_parameters", "rope_scaling"):
    cfg.pop(k, None)
  cfg.update({k: v for k, v in fields.items() if v is not None})
  with open(path, "w") as f:
    json.dump(cfg, f, indent=2)


def make_qwen3_rope() -> None:
  """Cases with RoPE scaling: the logits of positions past the original context."""
  yarn = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 128,
          "rope_theta": 10000.0}
  src, _, ref = _qwen3("q3_rope_yarn", 21, 1, 200, num_hidden_layers=2, head_dim=16,
                       max_position_embeddings=256, rope_parameters=dict(yarn))
  _rewrite_rope(src, rope_theta=10000.0, rope_parameters=dict(yarn), rope_scaling=dict(yarn))
  _check_reload(Qwen3MoeForCausalLM, src, ref)
  fields = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 96,
            "attention_factor": 1.25, "beta_fast": 16.0, "beta_slow": 2.0, "truncate": False,
            "rope_theta": 10000.0}
  src, _, ref = _qwen3("q3_rope_yarn_fields", 22, 1, 150, num_hidden_layers=2, head_dim=16,
                       max_position_embeddings=192, rope_parameters=dict(fields))
  _check_reload(Qwen3MoeForCausalLM, src, ref)
  src, _, ref = _qwen3("q3_rope_linear", 23, 2, 40, num_hidden_layers=2,
                       rope_parameters={"rope_type": "linear", "factor": 2.0,
                                        "rope_theta": 10000.0})
  _rewrite_rope(src, rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 2.0})
  _check_reload(Qwen3MoeForCausalLM, src, ref)


# ------------------------------------------------------------------------------------- Qwen3.5-MoE
def _released_layout(folder: str, n_shards: int, gen: torch.Generator,
                     interval: int | None = None) -> None:
  """Rewrites a Qwen3_5MoeForCausalLM folder into the layout of the released checkpoints; with
  `interval`, `layer_types` is dropped from the config in favour of `full_attention_interval`."""
  with open(os.path.join(folder, "config.json")) as f:
    text_cfg = json.load(f)
  if interval is not None:
    del text_cfg["layer_types"]
    text_cfg["full_attention_interval"] = interval
  tensors = _fuse_experts(_read_all(folder), text_cfg["num_experts"])
  renamed = {}
  for k, v in tensors.items():
    if k.startswith("model."):
      k = "model.language_model." + k[len("model."):]
    renamed[k] = v
  d = text_cfg["hidden_size"]
  renamed["model.visual.patch_embed.proj.weight"] = torch.randn(8, 3, 2, 2, 2, generator=gen)
  renamed["model.visual.blocks.0.norm1.weight"] = torch.ones(8)
  renamed["mtp.fc.weight"] = torch.randn(d, 2 * d, generator=gen)
  renamed["mtp.layers.0.input_layernorm.weight"] = torch.zeros(d)
  _write_shards(folder, renamed, n_shards)
  tie = text_cfg.pop("tie_word_embeddings", False)
  for k in ("architectures", "transformers_version", "dtype"):
    text_cfg.pop(k, None)
  outer = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
           "text_config": text_cfg, "tie_word_embeddings": tie,
           "vision_config": {"model_type": "qwen3_5_moe", "depth": 1, "hidden_size": 8},
           "image_token_id": 120, "video_token_id": 121, "vision_start_token_id": 122,
           "vision_end_token_id": 123, "transformers_version": "5.24.0"}
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(outer, f, indent=2)


def _qwen35(name: str, seed: int, b: int, s: int, **cfg_kw) -> tuple[str, torch.nn.Module, dict]:
  torch.manual_seed(seed)
  gen = torch.Generator().manual_seed(seed)
  cfg = Qwen3_5MoeTextConfig(**{**Q35_BASE, **cfg_kw}, attn_implementation="eager")
  model = Qwen3_5MoeForCausalLM(cfg).float()
  _perturb(model, gen)
  ref = _reference(model, _ids(gen, b, s, cfg.vocab_size))
  folder = _save_case(name, model, ref)
  print(f"{name}: layer_types {cfg.layer_types} logits {ref['logits'].shape} "
        f"aux {float(ref['aux_loss']):.6f}")
  return folder, model, ref


def make_qwen35() -> None:
  src, _, ref = _qwen35("q35_per_expert", 11, 1, 150, num_hidden_layers=3,
                        layer_types=["linear_attention", "full_attention", "linear_attention"],
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                         "partial_rotary_factor": 0.5})
  _check_reload(Qwen3_5MoeForCausalLM, src, ref)
  rel = _copy_case(src, "q35_released")
  _released_layout(rel, 2, torch.Generator().manual_seed(12))
  _check_reload(Qwen3_5MoeForCausalLM, rel, ref)
  src, _, ref = _qwen35("q35_interval", 13, 2, 70, num_hidden_layers=2, full_attention_interval=2,
                        rope_parameters={"rope_type": "default", "rope_theta": 1e6})
  _released_layout(src, 1, torch.Generator().manual_seed(14), interval=2)
  _check_reload(Qwen3_5MoeForCausalLM, src, ref)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--only", choices=("all", "rope"), default="all",
                  help="rope: only the RoPE scaling cases (leaves the other fixtures as they are)")
  only = ap.parse_args().only
  os.makedirs(OUT, exist_ok=True)
  torch.set_num_threads(2)
  if only == "rope":
    make_qwen3_rope()
  else:
    make_qwen3()
    make_qwen35()
  total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(OUT) for f in fs)
  print(f"wrote {OUT}: {total / 1e6:.2f} MB")


if __name__ == "__main__":
  main()
