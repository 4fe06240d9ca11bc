"""Held-out next-observation token accuracy (teacher forcing), beside a copy baseline.

For each trajectory one target turn t >= 1 is chosen (seeded). The chat is rendered as a training
stage renders it, and the score is the share of the target observation's BODY tokens that the
model's argmax predicts correctly given everything before them. The fixed scaffolding around the
body is not scored: the `**Environment Observation:**` header (which CPT leaves out of its loss,
docs/recipe.md), the thinking block and the `<predicted_observation>` tags of thinking mode, and the
end-of-message marker; those tokens that a trained model must write (tags, thinking block, end
marker) are scored apart as `scaffold`, the argmax accuracy and mean probability of the reply
format. The baseline predicts the same body tokens by copying the previous
observation's body tokens position by position (a world model that says "nothing changed"), the
judge-free floor every LWM must clear.

`world_coverage` says which worlds such a table covers: the distinct worlds (`meta["world"]`) of the
evaluated trajectories and how many of them the training trajectories contain.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from lwm_jax.data import prompts, splits
from lwm_jax.data.reply import OBS_CLOSE
from lwm_jax.data.schema import Trajectory


@dataclasses.dataclass
class Accuracy:
  model: float
  copy_previous: float
  tokens: int
  samples: int
  per_domain: dict[str, tuple[float, float, int]]   # domain -> (model, baseline, tokens)
  # with `train_worlds`: group -> (model, baseline, tokens), groups among GROUPS
  per_group: dict[str, tuple[float, float, int]] = dataclasses.field(default_factory=dict)
  # The reply's fixed scaffolding (`target_spans`: thinking block, tags, end marker), over the
  # same samples: the share of its tokens the argmax gets right and their mean probability. A
  # model that has not learned its reply format (greedy decoding then writes a second thinking
  # block, or no tag) shows here while its body score looks fine.
  scaffold: float = float("nan")
  scaffold_prob: float = float("nan")
  scaffold_tokens: int = 0


UNSEEN, SEEN, NO_WORLD = "unseen worlds", "seen worlds, new episodes", "no world id"
GROUPS = (UNSEEN, SEEN, NO_WORLD)


@dataclasses.dataclass
class WorldCoverage:
  trajectories: int
  worlds: int         # distinct world ids among them
  seen_in_train: int  # of those worlds, how many training trajectories also play
  missing: int        # trajectories without a world id

  def describe(self) -> str:
    """One line for a results table: how many worlds it covers and whether they are unseen."""
    if self.trajectories and self.missing == self.trajectories:
      return (f"worlds: not recorded for any of the {self.trajectories} trajectories (a corpus "
              "without world ids), so this table cannot tell whether they are unseen in training")
    text = f"worlds: {self.worlds} distinct among {self.trajectories} trajectories, "
    if self.seen_in_train == 0:
      text += "none of them seen in training"
    else:
      text += (f"{self.seen_in_train} of them also seen in training (reported as "
               f"'{SEEN}')")
    if self.missing:
      text += f"; {self.missing} trajectories have no world id ('{NO_WORLD}')"
    return text


def world_coverage(evaluated: Sequence[Trajectory], train: Sequence[Trajectory]
                   ) -> WorldCoverage:
  """The worlds of `evaluated` and how many of them `train` contains (by `meta["world"]`)."""
  train_worlds = {w for w in map(splits.world_of, train) if w is not None}
  worlds = {w for w in map(splits.world_of, evaluated) if w is not None}
  return WorldCoverage(trajectories=len(evaluated), worlds=len(worlds),
                       seen_in_train=len(worlds & train_worlds),
                       missing=sum(splits.world_of(t) is None for t in evaluated))


def _target(traj: Trajectory, seed: int) -> int:
  h = int.from_bytes(hashlib.blake2b(f"{traj.id}|{seed}".encode(), digest_size=8).digest(), "big")
  return 1 + h % (len(traj.turns) - 1)


def _render(traj: Trajectory, t: int, stage: str, seed: int, thinking: bool = True
            ) -> list[dict[str, str]]:
  if stage == "cpt":
    return prompts.render_messages(traj, t, prompts.variant_for("cpt", traj.id, seed))
  return prompts.render_messages(traj, t, prompts.variant_for("sft", traj.id, seed),
                                 thinking=thinking)


def body_positions(tokenizer, msgs: Sequence[dict], observation: str, thinking: bool
                   ) -> tuple[list[int], list[int]]:
  """Ids of the chat `msgs` and the positions in them of the last message's observation body.

  The last message is `format_observation(observation)` or, with `thinking`, the thinking target
  around it. Tokens that spell only header, tags or thinking text are left out; a token that
  straddles the header's end and the body's start counts as body (as the CPT loss counts it)."""
  ids, body, _ = target_spans(tokenizer, msgs, observation, thinking)
  return ids, body


def target_spans(tokenizer, msgs: Sequence[dict], observation: str, thinking: bool,
                 writes_header: bool | None = None) -> tuple[list[int], list[int], list[int]]:
  """`body_positions` plus the positions of the reply's fixed scaffolding that a trained model
  must also write: with `thinking`, the thinking block and tags before the body and the closing
  tag after it; in both modes the end-of-message marker. (The CPT header carries no loss and a
  CPT model is prompted with it written, so it is not scaffolding there; an SFT model trained
  without thinking writes the header itself: `writes_header`, default `thinking`.)"""
  ids: list[int] = []
  for m in msgs[:-1]:
    ids += tokenizer.encode_message(m)[0]
  last = msgs[-1]
  content = last["content"]
  suffix = OBS_CLOSE if thinking else ""
  start = len(content) - len(suffix) - len(observation)
  if start < 0 or content[start:] != observation + suffix:
    raise ValueError(f"the target message does not end with its observation{suffix}")
  msg_ids = tokenizer.encode_message(last)[0]
  body = tokenizer.encode_content(last["role"], content)
  head = len(tokenizer.encode_message({"role": last["role"], "content": ""})[0]) - 1 - len(
      tokenizer.encode("\n"))
  if msg_ids[head:head + len(body)] != body:
    raise ValueError("unexpected message layout from the tokenizer")
  lo = tokenizer.prefix_tokens(body, content[:start]) if start else 0
  hi = len(body) - _suffix_tokens(tokenizer, body, suffix)
  base = len(ids) + head
  writes_header = thinking if writes_header is None else writes_header
  scaffold = (list(range(base, base + lo)) if writes_header else []) + list(
      range(base + max(lo, hi), base + len(body)))
  if msg_ids[head + len(body)] == tokenizer.im_end_id:
    scaffold.append(base + len(body))
  return ids + msg_ids, list(range(base + lo, base + max(lo, hi))), scaffold


def _suffix_tokens(tokenizer, ids: Sequence[int], suffix: str) -> int:
  """How many trailing tokens of `ids` spell only characters of `suffix` (ending their text)."""
  if not suffix:
    return 0
  for k in range(1, len(ids) + 1):
    text = tokenizer.decode(ids[-k:])
    if len(text) >= len(suffix):
      return k if text == suffix else k - 1
  return len(ids)


def _scorer(model):
  """jit of ids [1, S] -> (argmax [1, S], log-probability of each next id [1, S - 1])."""
  def scores(toks):
    logits = model(toks).logits.astype(jnp.float32)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1], axis=-1), toks[:, 1:, None],
                               axis=-1)[..., 0]
    return jnp.argmax(logits, axis=-1), logp
  return jax.jit(scores)


def _padded(ids: Sequence[int]) -> jax.Array:
  """`ids` as [1, bucket] (a power of two, at least 64), so that few lengths are compiled."""
  bucket = max(64, 1 << (len(ids) - 1).bit_length())
  toks = np.zeros((1, bucket), np.int32)
  toks[0, :len(ids)] = ids
  return jnp.asarray(toks)


@dataclasses.dataclass
class TurnNLL:
  traj: int        # index into the scored trajectories
  turn: int        # 0-based turn whose observation body was scored
  nll: float       # summed negative log-likelihood of the body tokens, nats
  tokens: int      # body tokens
  dropped: int     # oldest history turns left out so that the sample fits `max_len`


def observation_nll(model, tokenizer, trajs: Sequence[Trajectory], stage: str = "sft",
                    seed: int = 0, max_len: int = 2048, thinking: bool | None = None
                    ) -> tuple[list[TurnNLL], int]:
  """Teacher-forced negative log-likelihood of EVERY turn's observation body (the real history
  before it, rendered as `observation_accuracy` renders it), one record per turn. A sample longer
  than `max_len` loses its oldest history turns until it fits, as the sampler's prompts do; one
  that does not fit even without history is skipped. Returns (records, turns skipped).

  The model is causal, so a turn whose sample is a prefix of a later turn's sample (without
  thinking, history turns are written as the target is) is read off that sample's pass: turns
  are visited last to first and a pass is reused while it covers the next sample."""
  fwd = _scorer(model)
  think = stage != "cpt" and (thinking is None or bool(thinking))
  out, skipped = [], 0
  for i, traj in enumerate(trajs):
    done: list[TurnNLL] = []
    seen: tuple[list[int], np.ndarray] | None = None  # the last pass: its ids and log-probs
    for t in reversed(range(len(traj.turns))):
      msgs = _render(traj, t, stage, seed, think)
      dropped = 0
      while True:
        ids, body, _ = target_spans(tokenizer, msgs, traj.turns[t].observation, think,
                                    stage != "cpt")
        if len(ids) <= max_len or len(msgs) <= 3:
          break
        msgs = msgs[:1] + msgs[3:]  # the oldest (action, observation) pair
        dropped += 1
      if len(ids) > max_len or not body:
        skipped += 1
        continue
      if seen is None or seen[0][:len(ids)] != ids:
        seen = (ids, np.asarray(fwd(_padded(ids))[1])[0])
      pos = np.asarray(body, np.int64) - 1
      done.append(TurnNLL(i, t, -float(np.sum(seen[1][pos])), len(body), dropped))
    out += done[::-1]
  return out, skipped


def observation_accuracy(model, tokenizer, trajs: Sequence[Trajectory], stage: str = "sft",
                         seed: int = 0, max_len: int = 2048,
                         train_worlds: set[str] | None = None,
                         thinking: bool | None = None) -> Accuracy:
  """Teacher-forced accuracy on one target observation per trajectory (see module docstring).
  Samples longer than `max_len` tokens are skipped and counted in `samples` only when kept.
  With `train_worlds` (the world ids of the training data), `per_group` splits the score into
  unseen worlds, seen worlds with new episodes, and trajectories without a world id.
  `thinking` (default: on for SFT and RL, off for CPT) renders SFT targets in thinking mode or,
  off, as the history turns read: for a model trained with `--thinking=off`."""
  fwd = _scorer(model)
  hits = base_hits = total = kept = 0
  s_hits, s_prob, s_total = 0, 0.0, 0
  dom: dict[str, list[int]] = {}
  for traj in trajs:
    if len(traj.turns) < 2:
      continue
    t = _target(traj, seed)
    think = stage != "cpt" and (thinking is None or bool(thinking))
    ids, body, scaffold = target_spans(tokenizer, _render(traj, t, stage, seed, think),
                                       traj.turns[t].observation, think, stage != "cpt")
    # The previous observation's body, rendered the same way, is the copy baseline.
    prev_ids, prev_body = body_positions(tokenizer, _render(traj, t - 1, stage, seed, think),
                                         traj.turns[t - 1].observation, think)
    if len(ids) > max_len:
      continue
    kept += 1
    pos = np.asarray(body, np.int64)
    prev = [prev_ids[i] for i in prev_body]
    pred, logp = (np.asarray(x)[0] for x in fwd(_padded(ids)))
    target = np.asarray(ids)[pos]
    sc = np.asarray(scaffold, np.int64)
    s_hits += int(np.sum(pred[sc - 1] == np.asarray(ids)[sc]))
    s_prob += float(np.sum(np.exp(logp[sc - 1])))
    s_total += len(sc)
    h = int(np.sum(pred[pos - 1] == target))
    b = sum(1 for j, tok in enumerate(target) if j < len(prev) and prev[j] == tok)
    hits, base_hits, total = hits + h, base_hits + b, total + len(pos)
    keys = [traj.domain]
    if train_worlds is not None:
      w = splits.world_of(traj)
      keys.append(NO_WORLD if w is None else SEEN if w in train_worlds else UNSEEN)
    for k in keys:
      d = dom.setdefault(k, [0, 0, 0])
      d[0], d[1], d[2] = d[0] + h, d[1] + b, d[2] + len(pos)
  rate = lambda v: (v[0] / max(v[2], 1), v[1] / max(v[2], 1), v[2])
  per = {k: rate(v) for k, v in sorted(dom.items()) if k not in GROUPS}
  groups = {k: rate(dom[k]) for k in GROUPS if k in dom}
  return Accuracy(hits / max(total, 1), base_hits / max(total, 1), total, kept, per, groups,
                  scaffold=s_hits / s_total if s_total else float("nan"),
                  scaffold_prob=s_prob / s_total if s_total else float("nan"),
                  scaffold_tokens=s_total)
