"""Grain input pipelines for the three stages: cpt, sft and rl-prompts.

    trajectories (JSONL files or a built TFDS dir) -> this process's shard -> seeded shuffle per
    epoch -> render (prompts) -> tokenize per segment (tokenizer) -> loss mask (masking)
    -> over-long policy -> pack into [batch, seq_len] -> batch           (rl-prompts: no packing)

Train batches (cpt, sft) are dicts of numpy arrays, all [batch, seq_len]:
  tokens        int32   token ids, `pad_id` where empty
  positions     int32   position inside its packed document, restarting at 0
  segment_ids   int32   1.. per packed document, 0 for padding
  loss_weights  float32 weight of token i AS A PREDICTION TARGET: the trainer predicts
                        tokens[:, 1:] from tokens[:, :-1] with weights loss_weights[:, 1:] and masks
                        pairs whose segment ids differ. The first token of every document is a
                        `<|im_start|>` header with weight 0.
CPT: whole trajectories in template v1, weight 1 on the observation tokens (and their
`<|im_end|>`) of turns that `masking.keep_turn` keeps. A trajectory longer than seq_len is cut
into several documents, each starting with the system prompt (no observation is lost); a single
turn that does not fit is truncated. SFT: one target turn per trajectory (seeded), template
`variant_for("sft", id, seed)`, thinking target with `meta["think"][turn]` when present; weight 1
on the assistant target. Over-long: the oldest history turns are dropped; if system + target still
do not fit, the system prompt's content is shortened from its end (then, as a last resort, the
target's tail). Both are counted in `DataIterator.stats`.

rl-prompts batches: `tokens` int32 [batch, seq_len] (prompt with generation header, right-padded),
`lengths` int32 [batch], and object arrays `ids`, `domains`, `ground_truths`, `turns`, `prompts`
(the chat messages as JSON).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
from typing import Any, Sequence

import grain
import ml_collections
import numpy as np

from lwm_jax.data import hygiene as hygiene_lib
from lwm_jax.data import importers, masking, prompts
from lwm_jax.data.schema import Trajectory
from lwm_jax.data.tokenizer import Tokenizer

STAGES = ("cpt", "sft", "rl-prompts")
_TRAIN_KEYS = ("tokens", "loss_weights", "n_dropped", "n_cut", "n_split")


def default_data_config() -> ml_collections.ConfigDict:
  """Data fields shared by every stage (override per experiment).

  jsonl:        comma-separated trajectory files (.jsonl / .jsonl.gz; trajectory, AgentWorldBench
                or chat format, detected per file); used when `tfds_dir` is empty
  tfds_dir:     a dataset built by `launch/data.py build` (random access ArrayRecord)
  split:        TFDS split name ('train', 'validation', 'test', or slices like 'train[:10]')
  validation:   'strict' (first bad JSONL line raises path:line) or 'skip' (count and go on)
  hygiene:      apply the SPECS 2 hygiene filters to JSONL input (TFDS builds already did)
  seq_len:      tokens per packed row (and the prompt budget for rl-prompts)
  batch_size:   rows per batch, per process
  seed:         shuffle seed; also picks SFT/RL target turns and SFT prompt variants
  shuffle:      shuffle trajectories (a fresh order each epoch)
  num_epochs:   passes over the data; -1 repeats forever
  mask_seed:    seed of the CPT keep decisions (`masking.keep_turn`)
  loss_masking: CPT only: apply the information-theoretic mask (False: all observations count)
  thinking:     SFT only: thinking-mode targets (<think> + <predicted_observation>)
  num_packing_bins: rows the packer fills at once (more bins, denser packing, more latency)
  worker_count: Grain worker processes (0: everything in this process)
  worker_buffer_size: batches each worker prepares ahead
  """
  return ml_collections.ConfigDict(dict(
      jsonl="", tfds_dir="", split="train", validation="strict", hygiene=True,
      seq_len=2048, batch_size=8, seed=0, shuffle=True, num_epochs=-1, mask_seed=0,
      loss_masking=True, thinking=True, num_packing_bins=8, worker_count=0,
      worker_buffer_size=2))


# --- sources ----------------------------------------------------------------------------------
def load_source(cfg: ml_collections.ConfigDict) -> Sequence[Trajectory]:
  """The whole split as a random-access sequence of trajectories."""
  if cfg.tfds_dir:
    from lwm_jax.data import tfds_trajectories
    return tfds_trajectories.load_split(cfg.tfds_dir, cfg.split)
  paths = [p.strip() for p in str(cfg.jsonl).split(",") if p.strip()]
  if not paths:
    raise ValueError("data config: set `jsonl` (comma-separated files) or `tfds_dir`")
  trajs: list[Trajectory] = []
  for p in paths:
    t, _ = importers.load_any(p, mode=cfg.validation)
    trajs.extend(t)
  if cfg.hygiene:
    trajs = hygiene_lib.filter_trajectories(trajs)
  return trajs


def _hash_int(*parts: Any) -> int:
  h = hashlib.blake2b("\x1f".join(map(str, parts)).encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(h, "big")


def target_turn(traj: Trajectory, seed: int) -> int:
  """The seeded prediction target of a trajectory (one per trajectory, SPECS 2)."""
  return _hash_int(seed, "target", traj.id) % len(traj.turns)


def think_text(traj: Trajectory, turn: int) -> str:
  think = traj.meta.get("think")
  if isinstance(think, list) and turn < len(think) and isinstance(think[turn], str):
    return think[turn]
  if isinstance(think, dict) and isinstance(think.get(str(turn)), str):
    return think[str(turn)]
  return ""


# --- samples ----------------------------------------------------------------------------------
def _arr(ids: list[int], weights: list[float], dropped: int = 0, cut: int = 0, split: int = 0):
  n = len(ids)
  stat = lambda v: np.array([v] + [0] * (n - 1), np.int32)
  return {"tokens": np.asarray(ids, np.int32), "loss_weights": np.asarray(weights, np.float32),
          "n_dropped": stat(dropped), "n_cut": stat(cut), "n_split": stat(split)}


def cpt_samples(traj: Trajectory, tok: Tokenizer, cfg: ml_collections.ConfigDict
                ) -> list[dict[str, np.ndarray]]:
  """One or more packed-ready documents for a whole trajectory (template v1)."""
  msgs = prompts.render_messages(traj, None, prompts.variant_for("cpt", traj.id, cfg.seed))
  sys_ids, sys_w = tok.encode_message(msgs[0])
  pairs = []
  for k, t in enumerate(traj.turns):
    keep = (not cfg.loss_masking) or masking.keep_turn(traj.id, k, t.action, t.observation,
                                                      cfg.mask_seed)
    u_ids, u_w = tok.encode_message(msgs[1 + 2 * k])
    a_ids, a_w = tok.encode_message(msgs[2 + 2 * k], 1.0 if keep else 0.0)
    pairs.append((u_ids + a_ids, u_w + a_w))
  docs, cur_ids, cur_w, cut = [], list(sys_ids), list(sys_w), 0
  for ids, w in pairs:
    if len(cur_ids) + len(ids) > cfg.seq_len and len(cur_ids) > len(sys_ids):
      docs.append((cur_ids, cur_w))
      cur_ids, cur_w = list(sys_ids), list(sys_w)
    cur_ids += ids
    cur_w += w
    if len(cur_ids) > cfg.seq_len:
      cur_ids, cur_w, cut = cur_ids[:cfg.seq_len], cur_w[:cfg.seq_len], cut + 1
      docs.append((cur_ids, cur_w))
      cur_ids, cur_w = list(sys_ids), list(sys_w)
  if len(cur_ids) > len(sys_ids):
    docs.append((cur_ids, cur_w))
  return [_arr(ids, w, cut=cut if i == 0 else 0, split=int(i > 0))
          for i, (ids, w) in enumerate(docs)]


def _fit_history(tok: Tokenizer, msgs: list[dict], budget: int, target_weight: float,
                 add_generation_prompt: bool = False):
  """Encodes system + history + target, dropping the oldest history pairs to fit `budget`."""
  enc = [tok.encode_message(m) for m in msgs[:-1]]
  last = (tok.encode_message(msgs[-1], target_weight) if not add_generation_prompt
          else tok.encode_message(msgs[-1]))
  tail_ids = last[0] + (tok.generation_prompt() if add_generation_prompt else [])
  tail_w = last[1] + ([0.0] * (len(tail_ids) - len(last[1])))
  n_hist = (len(enc) - 1) // 2
  # history pairs are enc[1:1 + 2 * n_hist]; for sft the target user message is enc[-1]
  hist = [enc[1 + 2 * j][0] + enc[2 + 2 * j][0] for j in range(n_hist)]
  hist_w = [enc[1 + 2 * j][1] + enc[2 + 2 * j][1] for j in range(n_hist)]
  rest = enc[1 + 2 * n_hist:]
  fixed = len(enc[0][0]) + sum(len(r[0]) for r in rest) + len(tail_ids)
  total = fixed + sum(len(h) for h in hist)
  drop = 0
  while total > budget and drop < n_hist:
    total -= len(hist[drop])
    drop += 1
  sys_ids, sys_w = list(enc[0][0]), list(enc[0][1])
  cut = 0
  if total > budget:  # even without history: shorten the system prompt's content from its end
    head = 1 + len(tok.encode(msgs[0]["role"] + "\n"))
    tail = 1 + len(tok.encode("\n"))
    room = max(0, len(sys_ids) - head - tail)
    shrink = min(total - budget, room)
    if shrink:
      keep = len(sys_ids) - tail - shrink
      sys_ids = sys_ids[:keep] + sys_ids[-tail:]
      sys_w = sys_w[:keep] + sys_w[-tail:]
    cut = 1
  ids, w = sys_ids, sys_w
  for h, hw in zip(hist[drop:], hist_w[drop:]):
    ids += h
    w += hw
  for r in rest:
    ids += r[0]
    w += r[1]
  ids += tail_ids
  w += tail_w
  return ids[:budget], w[:budget], drop, cut


def sft_sample(traj: Trajectory, tok: Tokenizer, cfg: ml_collections.ConfigDict
               ) -> dict[str, np.ndarray]:
  t = target_turn(traj, cfg.seed)
  variant = prompts.variant_for("sft", traj.id, cfg.seed)
  think = think_text(traj, t) if cfg.get("thinking_target", "recorded") == "recorded" else ""
  msgs = prompts.render_messages(traj, t, variant, thinking=cfg.thinking, think=think)
  ids, w, drop, cut = _fit_history(tok, msgs, cfg.seq_len, 1.0)
  return _arr(ids, w, dropped=drop, cut=cut)


def rl_prompt_sample(traj: Trajectory, tok: Tokenizer, cfg: ml_collections.ConfigDict
                     ) -> dict[str, Any]:
  t = target_turn(traj, cfg.seed)
  msgs = prompts.prompt_messages(traj, t, prompts.variant_for("rl", traj.id, cfg.seed))
  ids, _, drop, cut = _fit_history(tok, msgs, cfg.seq_len, 0.0, add_generation_prompt=True)
  kept_msgs = [msgs[0]] + msgs[1 + 2 * drop:]
  return {"tokens": np.asarray(ids, np.int32), "id": traj.id, "domain": traj.domain,
          "turn": t, "ground_truth": traj.turns[t].observation,
          "prompt": json.dumps(kept_msgs, ensure_ascii=False), "n_dropped": drop, "n_cut": cut}


class _CptFlatMap(grain.experimental.FlatMapTransform):
  max_fan_out = 4096

  def __init__(self, tok: Tokenizer, cfg: ml_collections.ConfigDict):
    self.tok, self.cfg = tok, cfg

  def flat_map(self, traj: Trajectory) -> list[dict[str, np.ndarray]]:
    return cpt_samples(traj, self.tok, self.cfg)


# --- datasets ---------------------------------------------------------------------------------
def shard_source(source: Sequence[Trajectory], process_index: int, process_count: int
                 ) -> grain.MapDataset:
  """This process's disjoint share of the split: items process_index, +process_count, ..."""
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, {process_count})")
  return grain.MapDataset.source(source)[process_index::process_count]


def trajectory_dataset(source: Sequence[Trajectory], cfg: ml_collections.ConfigDict,
                       process_index: int = 0, process_count: int = 1) -> grain.MapDataset:
  ds = shard_source(source, process_index, process_count)
  if len(ds) == 0:
    raise ValueError(f"process {process_index} of {process_count} has no data "
                     f"({len(source)} trajectories in the split)")
  if cfg.shuffle:
    ds = ds.shuffle(seed=cfg.seed)
  return ds.repeat(None if cfg.num_epochs < 0 else cfg.num_epochs)


def sample_dataset(source: Sequence[Trajectory], tok: Tokenizer, cfg: ml_collections.ConfigDict,
                   stage: str, process_index: int = 0, process_count: int = 1
                   ) -> grain.IterDataset:
  """Tokenized, weighted samples before packing (rl-prompts: before batching)."""
  if stage not in STAGES:
    raise ValueError(f"unknown stage '{stage}' (expected one of {', '.join(STAGES)})")
  ds = trajectory_dataset(source, cfg, process_index, process_count)
  if stage == "sft":
    return ds.map(lambda t: sft_sample(t, tok, cfg)).to_iter_dataset()
  if stage == "rl-prompts":
    return ds.map(lambda t: rl_prompt_sample(t, tok, cfg)).to_iter_dataset()
  return grain.experimental.FlatMapIterDataset(ds.to_iter_dataset(), _CptFlatMap(tok, cfg))


def _rl_batch(tok: Tokenizer, seq_len: int):
  def fn(items: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    tokens = np.full((len(items), seq_len), tok.pad_id, np.int32)
    for i, it in enumerate(items):
      tokens[i, :len(it["tokens"])] = it["tokens"]
    out = {"tokens": tokens, "lengths": np.array([len(it["tokens"]) for it in items], np.int32)}
    for key, name in (("id", "ids"), ("domain", "domains"), ("ground_truth", "ground_truths"),
                      ("turn", "turns"), ("prompt", "prompts"), ("n_dropped", "n_dropped"),
                      ("n_cut", "n_cut")):
      out[name] = np.array([it[key] for it in items], dtype=object)
    return out
  return fn


def _finish_packed(tok: Tokenizer):
  def fn(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    seg = x["tokens_segment_ids"].astype(np.int32)
    tokens = np.where(seg > 0, x["tokens"], tok.pad_id).astype(np.int32)
    return {"tokens": tokens, "positions": x["tokens_positions"].astype(np.int32),
            "segment_ids": seg, "loss_weights": x["loss_weights"].astype(np.float32),
            "n_dropped": x["n_dropped"], "n_cut": x["n_cut"], "n_split": x["n_split"]}
  return fn


def batched_dataset(source: Sequence[Trajectory], tok: Tokenizer, cfg: ml_collections.ConfigDict,
                    stage: str, process_index: int = 0, process_count: int = 1
                    ) -> grain.IterDataset:
  ds = sample_dataset(source, tok, cfg, stage, process_index, process_count)
  if stage == "rl-prompts":
    ds = ds.batch(cfg.batch_size, batch_fn=_rl_batch(tok, cfg.seq_len))
  else:
    ds = grain.experimental.FirstFitPackIterDataset(
        ds, length_struct={k: cfg.seq_len for k in _TRAIN_KEYS},
        num_packing_bins=cfg.num_packing_bins, seed=cfg.seed, shuffle_bins=True)
    ds = ds.map(_finish_packed(tok)).batch(cfg.batch_size)
  if cfg.worker_count > 0:
    from absl import flags  # Grain workers read absl flags; outside an absl app, use defaults
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(
        num_workers=cfg.worker_count, per_worker_buffer_size=cfg.worker_buffer_size))
  return ds


class DataIterator:
  """Batches of one stage; `get_state()` / `set_state()` resume exactly (JSON-friendly state).

  `stats` counts, since the start (restored with the state): batches, documents, tokens,
  loss_tokens (weight > 0), dropped_turns (history turns removed to fit), cut (samples
  truncated at seq_len), split_docs (extra CPT documents from long trajectories).
  """

  def __init__(self, dataset: grain.IterDataset, stage: str):
    self.stage = stage
    self._it = iter(dataset)
    self.stats: collections.Counter = collections.Counter()

  def __iter__(self) -> "DataIterator":
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    b = next(self._it)
    s = self.stats
    s["batches"] += 1
    s["dropped_turns"] += int(np.sum(b.pop("n_dropped")))
    s["cut"] += int(np.sum(b.pop("n_cut")))
    if self.stage == "rl-prompts":
      s["documents"] += len(b["lengths"])
      s["tokens"] += int(b["lengths"].sum())
    else:
      s["split_docs"] += int(np.sum(b.pop("n_split")))
      s["documents"] += int(np.sum(b["positions"] == 0) - np.sum(
          (b["positions"] == 0) & (b["segment_ids"] == 0)))
      s["tokens"] += int(np.sum(b["segment_ids"] > 0))
      s["loss_tokens"] += int(np.sum(b["loss_weights"] > 0))
    return b

  def get_state(self) -> dict[str, Any]:
    return {"grain": self._it.get_state(), "stats": dict(self.stats)}

  def set_state(self, state: dict[str, Any]) -> None:
    self._it.set_state(state["grain"])
    self.stats = collections.Counter(state.get("stats", {}))

  @property
  def grain_iterator(self) -> grain.DatasetIterator:
    return self._it


def make_train_iterator(data_cfg: ml_collections.ConfigDict, tokenizer: Tokenizer, stage: str,
                        process_index: int = 0, process_count: int = 1,
                        source: Sequence[Trajectory] | None = None) -> DataIterator:
  """The checkpointable batch iterator of `stage` for process `process_index` of `process_count`.

  `source` overrides the config's jsonl/tfds_dir (a list of trajectories or any random-access
  sequence of them).
  """
  validate_config(data_cfg, stage)
  src = source if source is not None else load_source(data_cfg)
  return DataIterator(batched_dataset(src, tokenizer, data_cfg, stage, process_index,
                                      process_count), stage)


def validate_config(cfg: ml_collections.ConfigDict, stage: str) -> None:
  if stage not in STAGES:
    raise ValueError(f"unknown stage '{stage}' (expected one of {', '.join(STAGES)})")
  for field, lo in (("seq_len", 8), ("batch_size", 1), ("num_packing_bins", 1),
                    ("worker_count", 0)):
    if int(cfg[field]) < lo:
      raise ValueError(f"data config field '{field}' must be >= {lo}, got {cfg[field]}")
  if cfg.validation not in ("strict", "skip"):
    raise ValueError(f"data config field 'validation' must be strict or skip, "
                     f"got '{cfg.validation}'")
  if cfg.num_epochs == 0 or cfg.num_epochs < -1:
    raise ValueError(f"data config field 'num_epochs' must be >= 1 or -1, got {cfg.num_epochs}")
