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
`<|im_end|>`) of turns that `masking.keep_turn` keeps; the `**Environment Observation:**` header
that opens every observation message has weight 0. A trajectory longer than seq_len is cut
into several documents, each starting with the system prompt (no observation is lost); when the
system prompt and a turn do not fit together, the document windows them (`lengths.cpt_windows`)
so that it still carries observation tokens. SFT: one target turn per trajectory (seeded),
template `variant_for("sft", id, seed)`, thinking target with `meta["think"][turn]` when present;
weight 1 on the assistant target; with `sft_history_loss` (SFT without thinking only, where every
history reply is rendered exactly as the target) weight 1 on every observation of the kept history
too, so one sample trains each of its turns. Over-long SFT samples and RL prompts are dropped (config
`overlong='drop'`, the recipe) or, with `overlong='truncate_history'`, lose their oldest history
turns (then the system prompt's tail). Every drop and cut is counted in `DataIterator.stats`.

CPT knowledge text: with `knowledge_jsonl` (plain documents, `lwm_jax/data/documents.py`) the CPT
sample stream interleaves whole-document samples with FULL loss so that they make up
`knowledge_share` of the tokens (`TokenShareMix`: the stream that is furthest behind its share gives
the next sample, so the measured share tracks the target within one sample); the documents repeat
and reshuffle as often as needed, the trajectories end the stream. CPT copy drill: with
`drill_share` > 0, induction rows (random ids, each segment written twice, `drills.induction_sample`;
rows of `drill_rows` ids, each its own packed document; `far<N>` rows copy from up to N ids back)
take that share of ALL the tokens, full loss, mixed in the same way after the knowledge text; they
teach copying from the context without the drill overwriting what the trajectories teach
(docs/reproduce.md, "Copying").

rl-prompts batches: `tokens` int32 [batch, seq_len] (prompt with generation header, right-padded),
`lengths` int32 [batch], and object arrays `ids`, `domains`, `ground_truths`, `turns`, `prompts`
(the chat messages as JSON).
"""
from __future__ import annotations

import collections
import hashlib
import json
from typing import Any, Sequence

import grain
import ml_collections
import numpy as np

from lwm_jax.data import hygiene as hygiene_lib
from lwm_jax.data import demos as demos_lib
from lwm_jax.data import documents as documents_lib
from lwm_jax.data import drills as drills_lib
from lwm_jax.data import importers, lengths, masking, prompts
from lwm_jax.data.bench_records import format_observation
from lwm_jax.data.schema import Trajectory
from lwm_jax.data.tokenizer import ENDOFTEXT, Tokenizer

STAGES = ("cpt", "sft", "rl-prompts")
_OBS_HEADER = format_observation("")  # every CPT observation's fixed header: never in the loss
_TRAIN_KEYS = ("tokens", "loss_weights") + documents_lib.COUNTS


def default_data_config() -> ml_collections.ConfigDict:
  """Data fields shared by every stage (override per experiment).

  jsonl:        comma-separated trajectory files (.jsonl / .jsonl.gz; trajectory, AgentWorldBench
                or chat format, detected per file); used when `tfds_dir` is empty
  tfds_dir:     a dataset built by `launch/data.py build` (random access ArrayRecord)
  split:        TFDS split name ('train', 'validation', 'test', or slices like 'train[:10]')
  validation:   'strict' (first bad JSONL line raises path:line) or 'skip' (count and go on)
  hygiene:      apply the hygiene filters (docs/recipe.md) to JSONL input (TFDS builds already did)
  seq_len:      tokens per packed row (and the prompt budget for rl-prompts)
  batch_size:   rows per batch, per process
  seed:         shuffle seed; also picks SFT/RL target turns and SFT prompt variants
  shuffle:      shuffle trajectories (a fresh order each epoch)
  num_epochs:   passes over the data; -1 repeats forever
  mask_seed:    seed of the CPT keep decisions (`masking.keep_turn`)
  loss_masking: CPT only: apply the information-theoretic mask (False: all observations count)
  thinking:     SFT only: thinking-mode targets (<think> + <predicted_observation>)
  overlong:     SFT and rl-prompts: 'drop' a sample longer than seq_len (counted), or
                'truncate_history' (drop its oldest turns, then the system prompt's tail)
  long_prompts: SFT only: use the long form of the sample's prompt variant (simulation guidance
                and worked examples from other training trajectories) with as many examples as
                fit in seq_len beside the whole sample; without room, the plain variant
  demo_jsonl:   where worked examples come from (comma-separated files); empty: the stage's
                own source (for the training split, the training pool)
  demo_pool_size: worked examples kept per domain;  demo_chars: longest example, in characters
  num_packing_bins: rows the packer fills at once (more bins, denser packing, more latency)
  worker_count: Grain worker processes (0: everything in this process)
  worker_buffer_size: batches each worker prepares ahead
  knowledge_jsonl: CPT only: comma-separated plain-document files (knowledge text, full loss);
                empty: none
  knowledge_share: CPT only: the share of tokens (0 <= share < 1) the knowledge documents take
  drill_share:  CPT only: the share of all tokens (0 <= share < 1) the induction drill takes
  drill_rows:   CPT only: comma list of the drill's row lengths in ids (e.g. "64,512"; each
                length gets the same share of the drill's tokens); `far<N>` (e.g. "512,far1536")
                is a far row of N ids, its copies up to N ids from their sources (drills.far_rows)
  sft_history_loss: SFT without thinking only: the observations of the sample's kept history carry
                loss as well as its target (they are rendered exactly like the target there;
                in thinking mode they are not, and the field must stay False)
  """
  return ml_collections.ConfigDict(dict(
      jsonl="", tfds_dir="", split="train", validation="strict", hygiene=True,
      seq_len=2048, batch_size=8, seed=0, shuffle=True, num_epochs=-1, mask_seed=0,
      loss_masking=True, thinking=True, overlong="drop", long_prompts=True, demo_jsonl="",
      demo_pool_size=8, demo_chars=1500, num_packing_bins=8, worker_count=0,
      worker_buffer_size=2, knowledge_jsonl="", knowledge_share=0.0, drill_share=0.0,
      drill_rows="64", sft_history_loss=False))


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
  """The seeded prediction target of a trajectory (one per trajectory)."""
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
  return documents_lib.sample_arrays(ids, weights, n_dropped=dropped, n_cut=cut, n_split=split)


def cpt_samples(traj: Trajectory, tok: Tokenizer, cfg: ml_collections.ConfigDict
                ) -> list[dict[str, np.ndarray]]:
  """One or more packed-ready documents for a whole trajectory (template v1)."""
  msgs = prompts.render_messages(traj, None, prompts.variant_for("cpt", traj.id, cfg.seed))
  turns = []
  for k, t in enumerate(traj.turns):
    keep = (not cfg.loss_masking) or masking.keep_turn(traj.id, k, t.action, t.observation,
                                                      cfg.mask_seed)
    turns.append((tok.encode_message(msgs[1 + 2 * k]),
                  tok.encode_message(msgs[2 + 2 * k], 1.0 if keep else 0.0, _OBS_HEADER)))
  docs, cut = lengths.cpt_windows(tok, tok.encode_message(msgs[0]), turns, cfg.seq_len)
  return [_arr(ids, w, cut=cut if i == 0 else 0, split=int(i > 0))
          for i, (ids, w) in enumerate(docs)]


def sft_messages(traj: Trajectory, turn: int, variant: int, tok: Tokenizer,
                 cfg: ml_collections.ConfigDict, pool: demos_lib.DemoPool | None = None
                 ) -> list[dict[str, str]]:
  """The SFT chat of `traj` for target `turn`: the long form of `variant` with as many worked
  examples from `pool` as fit in `cfg.seq_len` beside the whole sample (the plain variant when
  `pool` is None or even the long form without examples does not fit)."""
  # `thinking_target`: "recorded" puts the trajectory's reasoning (meta["think"]) in the think
  # block, "empty" leaves it empty (docs/recipe.md, "Stage 2"), "instruction" restates the
  # simulation instruction there (`prompts.instruction_think`, docs/perturbations.md)
  target = cfg.get("thinking_target", "recorded")
  think = (think_text(traj, turn) if target == "recorded" else
           prompts.instruction_think(traj, variant) if target == "instruction" else "")
  render = lambda long, demos: prompts.render_messages(
      traj, turn, variant, thinking=cfg.thinking, think=think, long=long, demos=demos)
  plain = render(False, ())
  if pool is None:
    return plain
  rest = sum(len(tok.encode_message(m)[0]) for m in plain[1:])
  examples = pool.pick(traj, prompts.max_demos(variant), cfg.seed)
  for k in range(len(examples), -1, -1):
    msgs = render(True, examples[:k])
    if len(tok.encode_message(msgs[0])[0]) + rest <= cfg.seq_len:
      return msgs
  return plain


def demo_pool(cfg: ml_collections.ConfigDict, source: Sequence[Trajectory]
              ) -> demos_lib.DemoPool:
  """The worked-example pool of an SFT run: from `cfg.demo_jsonl`, else from `source`."""
  if cfg.get("demo_jsonl"):
    c = ml_collections.ConfigDict(cfg.to_dict())
    c.jsonl, c.tfds_dir = cfg.demo_jsonl, ""
    source = load_source(c)
  return demos_lib.DemoPool.from_source(source, cfg.get("demo_pool_size", 8),
                                        max_chars=cfg.get("demo_chars", 1500), seed=cfg.seed)


def _too_long(tok: Tokenizer, msgs: list[dict], budget: int, generation_prompt: bool) -> bool:
  n = sum(len(tok.encode_message(m)[0]) for m in msgs)
  return n + (len(tok.generation_prompt()) if generation_prompt else 0) > budget


_fit_history = lengths.fit_history


def sft_sample(traj: Trajectory, tok: Tokenizer, cfg: ml_collections.ConfigDict,
               pool: demos_lib.DemoPool | None = None) -> dict[str, np.ndarray]:
  t = target_turn(traj, cfg.seed)
  variant = prompts.variant_for("sft", traj.id, cfg.seed)
  msgs = sft_messages(traj, t, variant, tok, cfg, pool)
  if cfg.get("overlong", "drop") == "drop" and _too_long(tok, msgs, cfg.seq_len, False):
    return lengths.DROPPED
  ids, w, drop, cut = _fit_history(tok, msgs, cfg.seq_len, 1.0,
                                   history_weight=1.0 if cfg.get("sft_history_loss") else 0.0)
  return _arr(ids, w, dropped=drop, cut=cut)


def rl_prompt_sample(traj: Trajectory, tok: Tokenizer, cfg: ml_collections.ConfigDict
                     ) -> dict[str, Any]:
  t = target_turn(traj, cfg.seed)
  msgs = prompts.prompt_messages(traj, t, prompts.variant_for("rl", traj.id, cfg.seed))
  if cfg.get("overlong", "drop") == "drop" and _too_long(tok, msgs, cfg.seq_len, True):
    return lengths.DROPPED
  ids, _, drop, cut = _fit_history(tok, msgs, cfg.seq_len, 0.0, add_generation_prompt=True)
  kept_msgs = [msgs[0]] + msgs[1 + 2 * drop:]
  return {"tokens": np.asarray(ids, np.int32), "id": traj.id, "domain": traj.domain,
          "turn": t, "ground_truth": traj.turns[t].observation,
          "prompt": json.dumps(kept_msgs, ensure_ascii=False), "n_dropped": drop, "n_cut": cut,
          "n_overlong": 0}


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
  """This process's trajectories: positions process_index, +process_count, ... of ONE global
  stream (the whole split, shuffled by `seed` with a fresh order each epoch, repeated).

  Every process computes the same global order and reads (random access) only its own positions,
  so the processes' streams are disjoint, an epoch covers every trajectory exactly once across
  them, and the trajectories of global step t (process batch = global batch / process_count) are
  the same whatever the process count: for unpacked batches (rl-prompts) the global batch holds
  the same trajectories for 1 or N processes; packed stages (cpt, sft) pack each process's stream
  into its own rows. With one process this is the plain shuffled stream.
  """
  if len(shard_source(source, process_index, process_count)) == 0:
    raise ValueError(f"process {process_index} of {process_count} has no data "
                     f"({len(source)} trajectories in the split)")
  ds = grain.MapDataset.source(source)
  if cfg.shuffle:
    ds = ds.shuffle(seed=cfg.seed)
  ds = ds.repeat(None if cfg.num_epochs < 0 else cfg.num_epochs)
  return ds[process_index::process_count] if process_count > 1 else ds


def sample_dataset(source: Sequence[Trajectory], tok: Tokenizer, cfg: ml_collections.ConfigDict,
                   stage: str, process_index: int = 0, process_count: int = 1,
                   pool: demos_lib.DemoPool | None = None) -> grain.IterDataset:
  """Tokenized, weighted samples before packing (rl-prompts: before batching); `pool` gives SFT
  prompts their worked examples (see `sft_messages`)."""
  if stage not in STAGES:
    raise ValueError(f"unknown stage '{stage}' (expected one of {', '.join(STAGES)})")
  ds = trajectory_dataset(source, cfg, process_index, process_count)
  shard = len(shard_source(source, process_index, process_count))
  if stage == "sft":
    return lengths.SkipMarked(ds.map(lambda t: sft_sample(t, tok, cfg, pool)).to_iter_dataset(),
                              shard)
  if stage == "rl-prompts":
    return lengths.SkipMarked(ds.map(lambda t: rl_prompt_sample(t, tok, cfg)).to_iter_dataset(),
                              shard)
  ds = grain.experimental.FlatMapIterDataset(ds.to_iter_dataset(), _CptFlatMap(tok, cfg))
  if cfg.get("knowledge_jsonl"):
    ds = TokenShareMix(ds, knowledge_dataset(tok, cfg, process_index, process_count),
                       float(cfg.knowledge_share))
  if float(cfg.get("drill_share", 0.0)) > 0:
    ds = TokenShareMix(ds, drill_dataset(tok, cfg, process_index), float(cfg.drill_share))
  return ds


def drill_dataset(tok: Tokenizer, cfg: ml_collections.ConfigDict, process_index: int = 0
                  ) -> grain.IterDataset:
  """The CPT copy drill's samples (`drills.induction_sample`), forever; each process draws its
  own (seeded by the data seed and the process index)."""
  rows = drills_lib.parse_drill_rows(cfg.drill_rows)
  alphabet = drills_lib.drill_alphabet(tok.vocab_size, tok.special_tokens.values())
  marker = tok.special_tokens.get(ENDOFTEXT, tok.pad_id)
  seed = int(cfg.seed) * 1009 + process_index
  ds = grain.MapDataset.range(drills_lib.DRILL_PERIOD).repeat(None)
  ds = ds.map(lambda i: drills_lib.induction_sample(int(i), rows, alphabet, marker, seed))
  return ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))


class _DocFlatMap(grain.experimental.FlatMapTransform):
  max_fan_out = 4096

  def __init__(self, tok: Tokenizer, seq_len: int):
    self.tok, self.seq_len = tok, seq_len

  def flat_map(self, doc: documents_lib.Document) -> list[dict[str, np.ndarray]]:
    return documents_lib.document_samples(doc, self.tok, self.seq_len)


def knowledge_dataset(tok: Tokenizer, cfg: ml_collections.ConfigDict, process_index: int = 0,
                      process_count: int = 1) -> grain.IterDataset:
  """Full-loss samples of the knowledge documents, this process's share, reshuffled and repeated
  forever."""
  docs = documents_lib.read_documents(cfg.knowledge_jsonl)
  if not docs:
    raise ValueError(f"data config field 'knowledge_jsonl': no documents in {cfg.knowledge_jsonl}")
  ds = grain.MapDataset.source(docs)[process_index % len(docs)::process_count]
  ds = ds.shuffle(seed=cfg.seed + 1).repeat(None)
  # The documents sit in memory: read them in this thread (no prefetch threads to feed).
  ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
  return grain.experimental.FlatMapIterDataset(ds, _DocFlatMap(tok, cfg.seq_len))


class _TokenShareMixIterator(grain.DatasetIterator):

  def __init__(self, main: grain.DatasetIterator, extra: grain.DatasetIterator, share: float):
    super().__init__([main, extra])
    self._main, self._extra, self._share = main, extra, share
    self._tokens = [0, 0]  # tokens given so far from (main, extra)

  def __next__(self) -> dict[str, Any]:
    total = self._tokens[0] + self._tokens[1]
    if self._share > 0 and self._tokens[1] < self._share * total:
      x = next(self._extra)
      self._tokens[1] += len(x["tokens"])
      return x
    x = next(self._main)
    self._tokens[0] += len(x["tokens"])
    return x

  def get_state(self) -> dict[str, Any]:
    return {"main": self._main.get_state(), "extra": self._extra.get_state(),
            "tokens": list(self._tokens)}

  def set_state(self, state: dict[str, Any]) -> None:
    self._main.set_state(state["main"])
    self._extra.set_state(state["extra"])
    self._tokens = [int(v) for v in state["tokens"]]


class TokenShareMix(grain.IterDataset):
  """Interleaves `extra` into `main` so that `extra`'s samples hold `share` of the tokens: the next
  sample comes from `extra` while its token count is below `share` of all tokens given. The
  stream ends with `main`; `extra` must not run out (repeat it)."""

  def __init__(self, main: grain.IterDataset, extra: grain.IterDataset, share: float):
    if not 0.0 <= share < 1.0:
      raise ValueError(f"data config field 'knowledge_share' must be in [0, 1), got {share}")
    super().__init__([main, extra])
    self._main, self._extra, self._share = main, extra, share

  def __iter__(self) -> _TokenShareMixIterator:
    return _TokenShareMixIterator(self._main.__iter__(), self._extra.__iter__(), self._share)


def _rl_batch(tok: Tokenizer, seq_len: int):
  def fn(items: Sequence[dict[str, Any]]) -> dict[str, np.ndarray]:
    tokens = np.full((len(items), seq_len), tok.pad_id, np.int32)
    for i, it in enumerate(items):
      tokens[i, :len(it["tokens"])] = it["tokens"]
    out = {"tokens": tokens, "lengths": np.array([len(it["tokens"]) for it in items], np.int32)}
    for key, name in (("id", "ids"), ("domain", "domains"), ("ground_truth", "ground_truths"),
                      ("turn", "turns"), ("prompt", "prompts"), ("n_dropped", "n_dropped"),
                      ("n_cut", "n_cut"), ("n_overlong", "n_overlong")):
      out[name] = np.array([it[key] for it in items], dtype=object)
    return out
  return fn


def _finish_packed(tok: Tokenizer):
  def fn(x: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    seg = x["tokens_segment_ids"].astype(np.int32)
    tokens = np.where(seg > 0, x["tokens"], tok.pad_id).astype(np.int32)
    return {"tokens": tokens, "positions": x["tokens_positions"].astype(np.int32),
            "segment_ids": seg, "loss_weights": x["loss_weights"].astype(np.float32),
            **{k: x[k] for k in documents_lib.COUNTS}}
  return fn


def batched_dataset(source: Sequence[Trajectory], tok: Tokenizer, cfg: ml_collections.ConfigDict,
                    stage: str, process_index: int = 0, process_count: int = 1,
                    pool: demos_lib.DemoPool | None = None) -> grain.IterDataset:
  ds = sample_dataset(source, tok, cfg, stage, process_index, process_count, pool)
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
  loss_tokens (weight > 0), overlong_dropped (SFT/RL samples over seq_len, dropped),
  dropped_turns (history turns removed to fit), cut (samples truncated at seq_len),
  split_docs (extra CPT documents from long trajectories), knowledge_tokens (CPT tokens from
  knowledge documents), drill_tokens (CPT tokens of the copy drill).
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
    s["overlong_dropped"] += int(np.sum(b.pop("n_overlong")))
    if self.stage == "rl-prompts":
      s["documents"] += len(b["lengths"])
      s["tokens"] += int(b["lengths"].sum())
    else:
      s["split_docs"] += int(np.sum(b.pop("n_split")))
      s["knowledge_tokens"] += int(np.sum(b.pop("n_knowledge")))
      s["drill_tokens"] += int(np.sum(b.pop("n_drill")))
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
  pool = demo_pool(data_cfg, src) if stage == "sft" and data_cfg.get("long_prompts") else None
  return DataIterator(batched_dataset(src, tokenizer, data_cfg, stage, process_index,
                                      process_count, pool), stage)


def validate_config(cfg: ml_collections.ConfigDict, stage: str) -> None:
  if stage not in STAGES:
    raise ValueError(f"unknown stage '{stage}' (expected one of {', '.join(STAGES)})")
  for field, lo in (("seq_len", 8), ("batch_size", 1), ("num_packing_bins", 1),
                    ("worker_count", 0)):
    if int(cfg[field]) < lo:
      raise ValueError(f"data config field '{field}' must be >= {lo}, got {cfg[field]}")
  if cfg.get("overlong", "drop") not in lengths.OVERLONG_POLICIES:
    raise ValueError(f"data config field 'overlong' must be one of "
                     f"{', '.join(lengths.OVERLONG_POLICIES)}, got '{cfg.get('overlong')}'")
  if cfg.validation not in ("strict", "skip"):
    raise ValueError(f"data config field 'validation' must be strict or skip, "
                     f"got '{cfg.validation}'")
  if cfg.num_epochs == 0 or cfg.num_epochs < -1:
    raise ValueError(f"data config field 'num_epochs' must be >= 1 or -1, got {cfg.num_epochs}")
  share, docs = float(cfg.get("knowledge_share", 0.0)), cfg.get("knowledge_jsonl", "")
  if not 0.0 <= share < 1.0:
    raise ValueError(f"data config field 'knowledge_share' must be in [0, 1), got {share}")
  if docs and stage != "cpt":
    raise ValueError(f"data config field 'knowledge_jsonl' is for the cpt stage only (this is "
                     f"{stage}); leave it empty")
  if cfg.get("sft_history_loss") and (stage != "sft" or cfg.thinking):
    raise ValueError("data config field 'sft_history_loss' needs the sft stage without thinking "
                     f"(stage {stage}, thinking={bool(cfg.thinking)}): in thinking mode the history "
                     "replies are not written like the target, so they cannot be its targets")
  drill = float(cfg.get("drill_share", 0.0))
  if not 0.0 <= drill < 1.0:
    raise ValueError(f"data config field 'drill_share' must be in [0, 1), got {drill}")
  if drill > 0:
    if stage != "cpt":
      raise ValueError(f"data config field 'drill_share' is for the cpt stage only (this is "
                       f"{stage}); leave it at 0")
    longest = max(r.length for r in drills_lib.parse_drill_rows(cfg.get("drill_rows", "64")))
    if longest >= int(cfg.seq_len):
      raise ValueError(f"data config field 'drill_rows': a row of {longest} ids (and its marker) "
                       f"does not fit a packed row of seq_len {cfg.seq_len}")
  if bool(docs) != (share > 0):
    raise ValueError("data config fields 'knowledge_jsonl' and 'knowledge_share' go together: "
                     f"got knowledge_jsonl={docs!r} and knowledge_share={share}")
