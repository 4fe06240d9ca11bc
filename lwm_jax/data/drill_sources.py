"""Drills as batch sources of the one trainer (`data.source = "drills"`).

A drill concentrates the loss on what a world model must learn and ordinary data dilutes: the
listing turns of terminal episodes (an `ls` answered from the initial state's file list), synthetic
copy rows (`drills.copy_row`), and the turns where a perturbed episode departs from its plain
twin (the tokens the simulation instruction decides). Each is a list of rendered rows (ids and
loss weights, rendered as the SFT pipeline renders a sample), and a source draws batches from them:

  ListingMix       each batch: listing rows, ordinary SFT rows of a corpus (a share `mix_share`)
                   and copy rows (a share `copy_share`), drawn with replacement
  DepartureRows    the rows of the departure pairs in a fresh random order each pass
  InductionRows    rows of random ids, each segment written twice (`drills.induction_rows`), loss
                   on every token: the induction drill of launch/copy_drill.py
  FlagRows         rows of random ids with one distant flag that decides the answer at the end
                   (`drills.flag_rows`), loss on the answer: can a model condition on a far token

Each draws from one seeded NumPy stream in the order the experiment scripts drew theirs
(experiments/made_up_names/, experiments/perturb_vs_plain/departure_drill/), so a seed gives the
rows those scripts trained on; the stream's state is the source's checkpointed state (exact
resume). Every process draws the whole global batch and keeps its own rows.

The `data.drills` section of a config (`default_config`) picks the drill and its inputs;
configs/world_model.py holds the shipped model's listing-drill stages.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Sequence

import ml_collections
import numpy as np

from lwm_jax.data import drills, lengths, pipeline, prompts, schema, splits
from lwm_jax.data.jsonl import iter_jsonl

Row = tuple  # (ids, weights) or (ids, weights, segment ids)
KINDS = ("listing", "departures", "induction", "flag")
RANDOM_ID_KINDS = ("induction", "flag")  # rows of random ids: no tokenizer, no rendering
ARMS = ("paired", "plain")


def default_config() -> ml_collections.ConfigDict:
  """The `data.drills` section.

  kind:        listing | departures | induction (rows of train.seq_len random ids, the whole
               vocabulary from id 3 up; segments of `drills.segment_range(seq_len)` written twice)
               | flag (rows of random ids with a distant flag that decides the row's answer,
               `drills.flag_rows`, loss on the answer only)
  alphabet:    induction: draw the segments from this many ids from id 3 up (0: the whole
               vocabulary), a smaller and easier version of the task
  listing:     comma list of terminal episode files (launch/collect.py output) whose listing turns
               among each episode's first `max_turn` turns are trained on
  mix:         a corpus folder whose training split gives the ordinary SFT rows (every turn)
  mix_share:   share of each batch from the ordinary rows (rounded to whole rows)
  copy_share:  share of each batch that is synthetic copy rows of the tokenizer's word pieces
  copy_short:  0: a copy row is one far row; else packed induction rows of this many pieces
  copies:      departures: comma list of folders with corpus_perturbed/ and corpus_plain/ (the
               same episodes with and without perturbations); a folder named twice weighs twice
  domains:     departures: the copies' domains used
  arm:         departures: paired (a perturbed sample and its twin, departing tokens weighted
               `weight`, the rest `rest_weight`) or plain (the twin and its next turn, weight 1)
  v0_share:    departures: share of episodes rendered in the evaluation template (variant 0)
  thinking:    auto (the start model's reply mode, from init_from_hf's provenance.json), on, off
  """
  return ml_collections.ConfigDict(dict(
      kind="listing", alphabet=0, listing="", max_turn=12, mix="", mix_share=0.5, copy_share=0.0,
      copy_short=0, copies="", domains="mcp,search,web", arm="paired", weight=5.0,
      rest_weight=1.0, v0_share=0.0, thinking="auto"))


# ----------------------------------------------------------------------- rendering rows
def template_of(traj: schema.Trajectory, cfg: ml_collections.ConfigDict,
                v0_share: float = 0.0) -> int:
  """The prompt template an episode's samples are rendered in: the evaluation template
  (variant 0) for a share `v0_share` of the episodes, fixed by the episode id (a perturbed
  episode and its plain twin agree), else the SFT pipeline's seeded choice among 2-11."""
  u = pipeline._hash_int("v0", traj.id) / 2.0**64  # pylint: disable=protected-access
  if u < v0_share:
    return 0
  return prompts.variant_for("sft", traj.id, cfg.seed)


def sft_row(traj: schema.Trajectory, turn: int, tok, cfg: ml_collections.ConfigDict,
            variant: int | None = None) -> tuple[list[int], list[float]]:
  """The SFT sample of `turn` as the pipeline renders it (history cut to fit `cfg.seq_len`), in
  template `variant` (None: the pipeline's choice for the episode): (ids, loss weights)."""
  if variant is None:
    variant = template_of(traj, cfg)
  msgs = pipeline.sft_messages(traj, turn, variant, tok, cfg)
  ids, w, _, _ = lengths.fit_history(tok, msgs, cfg.seq_len, 1.0)
  return ids, w


def listing_turns(paths: Sequence[str], max_turn: int) -> list[tuple[schema.Trajectory, int]]:
  """(episode, turn) for every listing turn among the first `max_turn` turns of each episode."""
  out = []
  for path in paths:
    if not os.path.isfile(path):
      raise FileNotFoundError(f"data.drills.listing: {path} does not exist")
    n = 0
    for traj in schema.read_jsonl(path):
      for k, turn in enumerate(traj.turns[:max_turn]):
        if drills.is_listing(turn.action):
          out.append((traj, k))
          n += 1
    logging.info("%s: %d listing turns", path, n)
  return out


def ordinary_turns(folder: str) -> list[tuple[schema.Trajectory, int]]:
  """(episode, turn) for every turn of a corpus folder's training split, file by file."""
  trajs = splits.read_split(folder, "train")
  if not trajs:
    raise FileNotFoundError(f"data.drills.mix: no training split (*_train.jsonl.gz) in {folder}")
  return [(t, k) for t in trajs for k in range(len(t.turns))]


def departure_pairs(copies: str, split: str, domains: Sequence[str]
                    ) -> list[tuple[schema.Trajectory, schema.Trajectory, int]]:
  """(perturbed episode, its plain twin, turn) for every turn where the observations differ while
  every action up to it agrees. Episodes without a twin in the plain copy are skipped and
  counted (logged)."""
  out, no_twin = [], 0
  for d in domains:
    pert_path = os.path.join(copies, "corpus_perturbed", f"{d}_{split}.jsonl.gz")
    plain_path = os.path.join(copies, "corpus_plain", f"{d}_{split}.jsonl.gz")
    for p in (pert_path, plain_path):
      if not os.path.exists(p):
        raise FileNotFoundError(f"data.drills.copies: {p} is missing (both copies are needed)")
    plain = {r["id"]: r for _, r in iter_jsonl(plain_path)}
    for _, rec in iter_jsonl(pert_path):
      if not str(rec.get("simulation_instruction", "")).strip():
        continue
      if rec["id"] not in plain:
        no_twin += 1
        continue
      a, b = schema.Trajectory.from_dict(rec), schema.Trajectory.from_dict(plain[rec["id"]])
      out += [(a, b, k) for k, dep in enumerate(drills.departing_turns(a, b)) if dep]
  logging.info("%s %s: %d departures; skipped %d perturbed episodes without a plain twin",
               copies, split, len(out), no_twin)
  return out


def departure_rows(pairs, arm: str, weight: float, tok, cfg: ml_collections.ConfigDict,
                   rest_weight: float = 1.0, v0_share: float = 0.0) -> list[Row]:
  """The rows of a departure arm, in pair order: `paired`, the perturbed sample and its twin of
  each departure with the departing target tokens at `weight` and the other target tokens at
  `rest_weight`; `plain`, the twin and the twin's next (or previous) turn, weight 1."""
  if arm not in ARMS:
    raise ValueError(f"data.drills.arm: {arm!r} is not one of {', '.join(ARMS)}")
  rows = []
  for a, b, k in pairs:
    v = template_of(a, cfg, v0_share)
    ids_a, w_a = sft_row(a, k, tok, cfg, v)
    ids_b, w_b = sft_row(b, k, tok, cfg, v)
    if arm == "paired":
      da, db = drills.departing(ids_a, w_a, ids_b, w_b)
      for ids, w, dep in ((ids_a, w_a, da), (ids_b, w_b, db)):
        w = [x * rest_weight for x in w]
        for i in dep:
          w[i] = weight
        rows.append((ids, w))
    else:
      other = k + 1 if k + 1 < len(b.turns) else max(k - 1, 0)
      rows.append((ids_b, w_b))
      rows.append(sft_row(b, other, tok, cfg, v))
  return rows


def pack(rows: Sequence[Row], seq_len: int) -> dict[str, np.ndarray]:
  """A next-token batch of `rows`, one a row, padded: `tokens`, `positions` (restarting at each
  segment), `segment_ids` (a row's third item where it has one, else 1; 0 on padding) and
  `loss_weights` (the weight of each token as a prediction target)."""
  b = len(rows)
  toks = np.zeros((b, seq_len), np.int32)
  wts = np.zeros((b, seq_len), np.float32)
  segs = np.zeros((b, seq_len), np.int32)
  for r, row in enumerate(rows):
    ids, w = row[0], row[1]
    if len(ids) > seq_len or len(w) != len(ids):
      raise ValueError(f"drill row {r}: {len(ids)} ids and {len(w)} weights for rows of "
                       f"{seq_len}")
    toks[r, :len(ids)], wts[r, :len(ids)] = ids, w
    seg = row[2] if len(row) == 3 and row[2] is not None else 1
    segs[r, :len(ids)] = np.asarray(seg)[:len(ids)] if np.ndim(seg) else seg
  idx = np.broadcast_to(np.arange(seq_len), (b, seq_len))
  starts = np.concatenate([np.ones((b, 1), bool), segs[:, 1:] != segs[:, :-1]], axis=1)
  positions = (idx - np.maximum.accumulate(np.where(starts, idx, 0), axis=1)).astype(np.int32)
  return {"tokens": toks, "positions": positions, "segment_ids": segs, "loss_weights": wts}


# ----------------------------------------------------------------------- sources
class _Seeded:
  """A seeded NumPy stream whose state is the source's checkpointed state; each process keeps its
  share of the global batch."""

  def __init__(self, batch: int, seq_len: int, seed: int, process_index: int, process_count: int):
    if batch % process_count:
      raise ValueError(f"config.train.batch_size: {batch} is not divisible by {process_count} "
                       "processes")
    self.batch, self.seq_len = batch, seq_len
    self.rng = np.random.default_rng(seed)
    self.batches = 0
    per = batch // process_count
    self.rows = slice(process_index * per, (process_index + 1) * per)

  def _state(self) -> dict[str, Any]:
    return {"rng": self.rng.bit_generator.state, "batches": self.batches}

  def _set(self, state: dict[str, Any]) -> None:
    self.rng.bit_generator.state = state["rng"]
    self.batches = int(state["batches"])

  def _batch(self, rows: list[Row]) -> dict[str, np.ndarray]:
    self.batches += 1
    return pack(rows[self.rows], self.seq_len)

  def next_rows(self) -> list[Row]:
    raise NotImplementedError

  def next_batch(self, state: Any = None) -> dict[str, np.ndarray]:
    del state
    return self._batch(self.next_rows())

  def get_state(self) -> dict[str, Any]:
    return self._state()

  def set_state(self, state: dict[str, Any]) -> None:
    self._set(state)


class ListingMix(_Seeded):
  """Batches of listing rows, ordinary rows (`n_mix` a batch) and copy rows (`n_copy`), drawn
  with replacement: listing and ordinary indices first, then the copy rows, from one stream."""

  def __init__(self, listing, ordinary, tok, cfg: ml_collections.ConfigDict, *, batch: int,
               mix_share: float, copy_share: float = 0.0, copy_short: int = 0,
               pieces: np.ndarray | None = None, seed: int = 0, process_index: int = 0,
               process_count: int = 1):
    super().__init__(batch, cfg.seq_len, seed, process_index, process_count)
    self.listing, self.ordinary, self.tok, self.cfg = listing, ordinary, tok, cfg
    self.n_mix = int(round(batch * mix_share))
    self.n_copy = int(round(batch * copy_share))
    self.copy_short, self.pieces = copy_short, pieces
    if not 0 <= mix_share <= 1 or not 0 <= copy_share <= 1:
      raise ValueError(f"data.drills.mix_share / copy_share: {mix_share} / {copy_share} must lie "
                       "in [0, 1]")
    if self.n_mix + self.n_copy > batch:
      raise ValueError(f"data.drills.mix_share {mix_share} and copy_share {copy_share} together "
                       f"exceed one batch of {batch}")
    if self.n_mix + self.n_copy < batch and not listing:
      raise ValueError("data.drills.listing: the files hold no listing turn")
    if self.n_mix and not ordinary:
      raise ValueError("data.drills.mix: no ordinary rows for mix_share > 0")
    if self.n_copy and pieces is None:
      raise ValueError("data.drills.copy_share > 0 needs the word pieces copy rows are made of")
    if copy_short and (copy_short < 8 or copy_short > cfg.seq_len):
      raise ValueError(f"data.drills.copy_short: {copy_short} must be 0 or 8 .. seq_len")

  def next_rows(self) -> list[Row]:
    """The next global batch as rows (advances the stream)."""
    rng, n_list = self.rng, self.batch - self.n_mix - self.n_copy
    take = ([self.listing[i] for i in rng.integers(0, len(self.listing) or 1, n_list)] +
            [self.ordinary[i] for i in rng.integers(0, len(self.ordinary) or 1, self.n_mix)])
    rows: list[Row] = [sft_row(t, k, self.tok, self.cfg) for t, k in take]
    rows += [drills.copy_row(rng, self.pieces, self.seq_len, self.copy_short)
             for _ in range(self.n_copy)]
    return rows

  def describe(self) -> str:
    return (f"listing drill: {len(self.listing)} listing turns, {len(self.ordinary)} ordinary "
            f"turns ({self.n_mix} a batch), {self.n_copy} copy rows a batch")


class DepartureRows(_Seeded):
  """Batches of the departure rows, each pass over them in a fresh random order."""

  def __init__(self, rows: list[Row], *, batch: int, seq_len: int, seed: int = 0,
               process_index: int = 0, process_count: int = 1):
    super().__init__(batch, seq_len, seed, process_index, process_count)
    if not rows:
      raise ValueError("data.drills.copies: no departure in the training copies")
    self.all_rows, self.order = rows, []

  def next_rows(self) -> list[Row]:
    if len(self.order) < self.batch:
      self.order += [int(i) for i in self.rng.permutation(len(self.all_rows))]
    take, self.order = self.order[:self.batch], self.order[self.batch:]
    return [self.all_rows[i] for i in take]

  def get_state(self) -> dict[str, Any]:
    return dict(self._state(), order=list(self.order))

  def set_state(self, state: dict[str, Any]) -> None:
    self._set(state)
    self.order = [int(i) for i in state["order"]]

  def describe(self) -> str:
    return f"departure drill: {len(self.all_rows)} rows"


class InductionRows(_Seeded):
  """Batches of induction rows (`drills.induction_rows`: ids `first_id` .. `first_id + alphabet -
  1`, each segment written twice), loss weight 1 on every token, from one seeded stream."""

  def __init__(self, *, batch: int, seq_len: int, alphabet: int, first_id: int = 3,
               seed: int = 0, process_index: int = 0, process_count: int = 1):
    super().__init__(batch, seq_len, seed, process_index, process_count)
    if alphabet < 2:
      raise ValueError(f"data.drills: an induction row needs an alphabet of 2 ids or more, "
                       f"got {alphabet}")
    self.alphabet, self.first_id = alphabet, first_id

  def next_rows(self) -> list[Row]:
    toks, _ = drills.induction_rows(self.rng, self.batch, self.seq_len, self.alphabet,
                                    drills.segment_range(self.seq_len), self.first_id)
    return [(r.tolist(), [1.0] * self.seq_len) for r in toks]

  def describe(self) -> str:
    return f"induction drill: rows of {self.seq_len} ids"


class FlagRows(_Seeded):
  """Batches of the distant-flag drill (`drills.flag_rows`), loss on the answer ids only."""

  def __init__(self, *, batch: int, seq_len: int, vocab: int, seed: int = 0,
               process_index: int = 0, process_count: int = 1):
    super().__init__(batch, seq_len, seed, process_index, process_count)
    self.vocab = vocab

  def next_rows(self) -> list[Row]:
    toks, weight = drills.flag_rows(self.rng, self.batch, self.seq_len, self.vocab)
    return [(t.tolist(), w.tolist()) for t, w in zip(toks, weight)]

  def describe(self) -> str:
    return f"flag drill: rows of {self.seq_len} ids"


def make_source(drill: ml_collections.ConfigDict, cfg: ml_collections.ConfigDict, tok,
                tokenizer_path: str, *, batch: int, seed: int = 0, process_index: int = 0,
                process_count: int = 1, vocab_size: int = 0):
  """The batch source of a `data.drills` section; `cfg` is the run's pipeline config (its
  `seq_len`, `seed` and `thinking` render the SFT rows); `vocab_size` (the model's) bounds the
  induction drill's ids."""
  if drill.kind not in KINDS:
    raise ValueError(f"data.drills.kind: {drill.kind!r} is not one of {', '.join(KINDS)}")
  where = dict(seed=seed, process_index=process_index, process_count=process_count)
  if drill.kind == "induction":
    alphabet = drill.get("alphabet", 0) or vocab_size - 3
    if alphabet > vocab_size - 3:
      raise ValueError(f"data.drills.alphabet: {alphabet} ids from id 3 up do not fit a "
                       f"vocabulary of {vocab_size}")
    return InductionRows(batch=batch, seq_len=cfg.seq_len, alphabet=alphabet, **where)
  if drill.kind == "flag":
    return FlagRows(batch=batch, seq_len=cfg.seq_len, vocab=vocab_size, **where)
  if drill.kind == "listing":
    if not drill.listing:
      raise ValueError("data.drills.listing: name the terminal episode files to drill on")
    listing = listing_turns([p for p in drill.listing.split(",") if p], drill.max_turn)
    ordinary = ordinary_turns(drill.mix) if drill.mix_share > 0 else []
    if drill.mix_share > 0 and not drill.mix:
      raise ValueError("data.drills.mix: a corpus folder is needed for mix_share > 0")
    pieces = drills.word_piece_ids(tokenizer_path) if drill.copy_share > 0 else None
    return ListingMix(listing, ordinary, tok, cfg, batch=batch, mix_share=drill.mix_share,
                      copy_share=drill.copy_share, copy_short=drill.copy_short, pieces=pieces,
                      **where)
  if not drill.copies:
    raise ValueError("data.drills.copies: name the folders of perturbed and plain copies")
  domains = [d for d in drill.domains.split(",") if d]
  folders = [f for f in drill.copies.split(",") if f]
  pairs_of = {f: departure_pairs(f, "train", domains) for f in dict.fromkeys(folders)}
  pairs = [x for f in folders for x in pairs_of[f]]
  rows = departure_rows(pairs, drill.arm, drill.weight, tok, cfg, drill.rest_weight,
                        drill.v0_share)
  return DepartureRows(rows, batch=batch, seq_len=cfg.seq_len, **where)
