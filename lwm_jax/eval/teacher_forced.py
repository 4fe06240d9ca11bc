"""Held-out next-observation token accuracy (teacher forcing), beside a copy baseline.

For each trajectory one target turn t >= 1 is chosen (seeded). The chat is rendered as a training
stage renders it, and the score is the share of the target observation message's tokens that the
model's argmax predicts correctly given everything before them. The baseline predicts those tokens
by copying the previous observation message's tokens position by position (a world model that says
"nothing changed"), the judge-free floor every LWM must clear.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lwm_jax.data import prompts
from lwm_jax.data.schema import Trajectory


@dataclasses.dataclass
class Accuracy:
  model: float
  copy_previous: float
  tokens: int
  samples: int
  per_domain: dict[str, tuple[float, float, int]]   # domain -> (model, baseline, tokens)


def _target(traj: Trajectory, seed: int) -> int:
  h = int.from_bytes(hashlib.blake2b(f"{traj.id}|{seed}".encode(), digest_size=8).digest(), "big")
  return 1 + h % (len(traj.turns) - 1)


def _render(traj: Trajectory, t: int, stage: str, seed: int) -> list[dict[str, str]]:
  if stage == "cpt":
    return prompts.render_messages(traj, t, prompts.variant_for("cpt", traj.id, seed))
  return prompts.render_messages(traj, t, prompts.variant_for("sft", traj.id, seed), thinking=True)


def observation_accuracy(model, tokenizer, trajs: Sequence[Trajectory], stage: str = "sft",
                         seed: int = 0, max_len: int = 2048) -> Accuracy:
  """Teacher-forced accuracy on one target observation per trajectory (see module docstring).
  Samples longer than `max_len` tokens are skipped and counted in `samples` only when kept."""
  fwd = jax.jit(lambda toks: jnp.argmax(model(toks).logits, axis=-1))
  hits = base_hits = total = kept = 0
  dom: dict[str, list[int]] = {}
  for traj in trajs:
    if len(traj.turns) < 2:
      continue
    t = _target(traj, seed)
    msgs = _render(traj, t, stage, seed)
    ids, w = tokenizer.encode_chat_with_weights(msgs, lambda i, _m, n=len(msgs): i == n - 1)
    # The previous observation message, rendered the same way, is the copy baseline.
    prev_msgs = _render(traj, t - 1, stage, seed)
    prev_ids, prev_w = tokenizer.encode_chat_with_weights(
        prev_msgs, lambda i, _m, n=len(prev_msgs): i == n - 1)
    if len(ids) > max_len:
      continue
    kept += 1
    pos = np.nonzero(np.asarray(w) > 0)[0]
    prev = [prev_ids[i] for i in np.nonzero(np.asarray(prev_w) > 0)[0]]
    bucket = max(64, 1 << (len(ids) - 1).bit_length())
    toks = np.zeros((1, bucket), np.int32)
    toks[0, :len(ids)] = ids
    pred = np.asarray(fwd(jnp.asarray(toks)))[0]
    target = np.asarray(ids)[pos]
    h = int(np.sum(pred[pos - 1] == target))
    b = sum(1 for j, tok in enumerate(target) if j < len(prev) and prev[j] == tok)
    hits, base_hits, total = hits + h, base_hits + b, total + len(pos)
    d = dom.setdefault(traj.domain, [0, 0, 0])
    d[0], d[1], d[2] = d[0] + h, d[1] + b, d[2] + len(pos)
  per = {k: (v[0] / max(v[2], 1), v[1] / max(v[2], 1), v[2]) for k, v in sorted(dom.items())}
  return Accuracy(hits / max(total, 1), base_hits / max(total, 1), total, kept, per)
