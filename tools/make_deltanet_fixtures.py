"""Writes tests/fixtures/deltanet_ref.npz: Gated DeltaNet reference outputs from `transformers`.

Run once with torch + transformers installed (they are not needed by the tests):
  .venv/bin/python tools/make_deltanet_fixtures.py
Contents (all float32):
  rule_*   inputs and outputs of torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule
           (S=150, not a multiple of the chunk 64; Hk=2 repeated to Hv=4; Dk=8 != Dv=12; an initial state)
  conv_*   causal_conv1d_fn (no activation) over a sequence, and causal_conv1d_update continuing from a state
  layer_*  a Qwen3_5MoeGatedDeltaNet with perturbed dt_bias / A_log / norm weight: HF-named weights in HF
           layouts ([out, in] linears, conv1d [C, 1, K]), an input [1, 150, 32] and its output
"""
from __future__ import annotations

import os

import numpy as np
import torch
from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as hf
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "deltanet_ref.npz")


def main() -> None:
  torch.manual_seed(0)
  rng = np.random.default_rng(0)
  f32 = lambda *shape: rng.normal(size=shape).astype(np.float32)
  out: dict[str, np.ndarray] = {}

  # --- the two delta-rule functions
  b, s, hk, hv, dk, dv = 1, 150, 2, 4, 8, 12
  q, k, v = f32(b, s, hk, dk), f32(b, s, hk, dk), f32(b, s, hv, dv)
  a_log = np.log(rng.uniform(0.5, 8.0, size=hv)).astype(np.float32)
  g = (-np.exp(a_log) * np.log1p(np.exp(f32(b, s, hv) - 2.0))).astype(np.float32)
  beta = (1 / (1 + np.exp(-f32(b, s, hv)))).astype(np.float32)
  s0 = (0.5 * f32(b, hv, dk, dv)).astype(np.float32)
  t = torch.from_numpy
  oc, sc = hf.torch_chunk_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta), chunk_size=64,
                                           initial_state=t(s0), output_final_state=True,
                                           use_qk_l2norm_in_kernel=True)
  orc, src = hf.torch_recurrent_gated_delta_rule(t(q), t(k), t(v), t(g), t(beta), initial_state=t(s0),
                                                 output_final_state=True, use_qk_l2norm_in_kernel=True)
  out.update(rule_q=q, rule_k=k, rule_v=v, rule_g=g, rule_beta=beta, rule_s0=s0,
             rule_o_chunk=oc.numpy(), rule_s_chunk=sc.numpy(),
             rule_o_rec=orc.numpy(), rule_s_rec=src.numpy())

  # --- causal conv: whole sequence, and 3 steps continuing from the state after 7 tokens
  c, kk, n = 6, 4, 10
  x, w = f32(1, n, c), f32(c, kk)
  y = hf.causal_conv1d_fn(t(x).transpose(1, 2), t(w), None, activation=None).transpose(1, 2)
  state = t(np.ascontiguousarray(x[:, 7 - kk:7].transpose(0, 2, 1)))  # HF keeps K inputs: [1, C, K]
  y_upd = hf.causal_conv1d_update(t(x[:, 7:]).transpose(1, 2).contiguous(), state, t(w), None,
                                  None).transpose(1, 2)
  out.update(conv_x=x, conv_w=w, conv_y=y.numpy(), conv_y_update=y_upd.numpy())

  # --- the whole layer
  cfg = Qwen3_5MoeTextConfig(
      hidden_size=32, num_hidden_layers=1, layer_types=["linear_attention"],
      linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
      linear_value_head_dim=12, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
      num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=64, num_experts=4,
      num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16)
  layer = hf.Qwen3_5MoeGatedDeltaNet(cfg, layer_idx=0).eval()
  with torch.no_grad():
    for name, p in layer.named_parameters():
      if name.endswith("proj_qkv.weight") or name.startswith("in_proj") or name.startswith("out_proj"):
        p.copy_(torch.from_numpy(0.15 * f32(*p.shape)))
    layer.conv1d.weight.copy_(torch.from_numpy(0.4 * f32(*layer.conv1d.weight.shape)))
    layer.dt_bias.copy_(torch.from_numpy(0.5 + 0.3 * f32(hv)))
    layer.A_log.copy_(torch.from_numpy(np.log(rng.uniform(0.5, 8.0, size=hv)).astype(np.float32)))
    layer.norm.weight.copy_(torch.from_numpy(1.0 + 0.2 * f32(dv)))
    xl = f32(1, 150, 32)
    yl = layer(t(xl))
  out["layer_x"] = xl
  out["layer_y"] = yl.numpy()
  for name, p in layer.named_parameters():
    out["layer." + name] = p.detach().numpy().astype(np.float32)

  np.savez_compressed(OUT, **out)
  print(f"wrote {os.path.normpath(OUT)} ({os.path.getsize(OUT) / 1024:.0f} KB, {len(out)} arrays)")


if __name__ == "__main__":
  main()
