"""A corpus folder of trajectory splits (`*_{split}.jsonl.gz`), more worlds beside it, and the
SentencePiece tokenizer trained on it: what the demo, the recipe and the experiments read."""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os

from lwm_jax.data import prompts, schema, splits, tokenizer as tok_lib


@dataclasses.dataclass
class Corpus:
  folder: str
  train_files: list[str]
  valid_files: list[str]
  test_files: list[str]
  train: list[schema.Trajectory]
  test: list[schema.Trajectory]

  @property
  def train_jsonl(self) -> str:
    return ",".join(self.train_files)

  @property
  def valid_jsonl(self) -> str:
    return ",".join(self.valid_files)

  def digest(self) -> str:
    """sha256 over the split files' bytes, in name order: which corpus a run trained on."""
    h = hashlib.sha256()
    for p in sorted(self.train_files + self.valid_files + self.test_files):
      h.update(os.path.basename(p).encode() + b"\0")
      with open(p, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def load_corpus(folder: str) -> Corpus:
  """The train / validation / test files of a corpus folder (`*_{split}.jsonl.gz`)."""
  files = {s: splits.split_files(folder, s) for s in splits.SPLITS}
  if not files["train"]:
    raise SystemExit(f"no corpus under {folder} (run `make corpus`)")
  return Corpus(folder, files["train"], files["validation"], files["test"],
                [t for p in files["train"] for t in schema.read_jsonl(p)],
                [t for p in files["test"] for t in schema.read_jsonl(p)])


def more_worlds(folder: str, corpus: Corpus, out_path: str) -> dict:
  """Training trajectories from more worlds: every split file (`*_{split}.jsonl.gz`) of another
  corpus folder (e.g. one `tools/make_corpus.py` wrote with another seed; several folders
  separated by commas), less each episode whose world is in `corpus`'s validation or test split
  (dropped and counted, so nothing held out leaks into training). Writes the kept ones to
  `out_path` and returns what was read, kept and dropped, with the written file's sha256."""
  files = []
  for one in folder.split(","):
    found = sorted(p for s in splits.SPLITS for p in splits.split_files(one, s))
    if not found:
      raise SystemExit(f"--more_worlds: no *_train/validation/test.jsonl.gz under {one}")
    files += found
  held = {splits.world_of(t) for p in corpus.valid_files for t in schema.read_jsonl(p)}
  held |= {splits.world_of(t) for t in corpus.test}
  held.discard(None)
  kept, dropped = [], 0
  for p in files:
    trajs = list(schema.read_jsonl(p))
    for t, world in zip(trajs, splits.require_worlds(trajs, p)):
      if world in held:
        dropped += 1
      else:
        kept.append(t)
  per_domain = collections.Counter(t.domain for t in kept)
  schema.write_jsonl(out_path, kept)
  with open(out_path, "rb") as f:
    sha = hashlib.sha256(f.read()).hexdigest()
  trained = {splits.world_of(t) for t in corpus.train}
  worlds = {splits.world_of(t) for t in kept}
  return {"folder": folder, "files": [os.path.join(os.path.basename(os.path.dirname(p)),
                                                    os.path.basename(p)) for p in files],
          "file": out_path,
          "sha256": sha, "trajectories": len(kept), "per_domain": dict(sorted(per_domain.items())),
          "worlds": len(worlds), "worlds_new": len(worlds - trained),
          "dropped_held_out_world": dropped}


def train_tokenizer(trajs, vocab: int, prefix: str, extra_texts=()) -> tuple[str, object, int]:
  """(model path, tokenizer, model vocabulary rounded up to a multiple of 128): SentencePiece on
  the trajectories' CPT system prompts, actions and observations (and `extra_texts`)."""
  texts = list(extra_texts)
  for traj in trajs:
    texts.append(prompts.system_prompt(traj, 1))
    for turn in traj.turns:
      texts += [turn.action, turn.observation]
  return load_tokenizer(tok_lib.train_sentencepiece(texts, vocab, prefix))


def load_tokenizer(sp: str) -> tuple[str, object, int]:
  """(sp, its tokenizer, the model vocabulary: its size rounded up to a multiple of 128)."""
  tok = tok_lib.load_tokenizer(sp)
  return sp, tok, -(-tok.vocab_size // 128) * 128


def given_start(folder: str, flag: str = "--start") -> tuple[str, str, int, int]:
  """(folder, its tokenizer.model, vocabulary, context) of a trained model's Hugging Face folder
  given as a starting point (e.g. the shipped data/world_model), checked: what is missing is
  named."""
  cfg_path, sp = os.path.join(folder, "config.json"), os.path.join(folder, "tokenizer.model")
  for need in (cfg_path, sp):
    if not os.path.isfile(need):
      raise SystemExit(f"{flag}: {need} is missing (a Hugging Face folder with its "
                       "SentencePiece tokenizer.model is expected)")
  try:
    with open(cfg_path) as f:
      hf_cfg = json.load(f)
  except (OSError, ValueError) as e:
    raise SystemExit(f"{flag}: {cfg_path} is not readable JSON: {e}") from None
  if not isinstance(hf_cfg, dict):
    raise SystemExit(f"{flag}: {cfg_path} holds a JSON {type(hf_cfg).__name__}, not an object")
  for key in ("vocab_size", "max_position_embeddings"):
    if not isinstance(hf_cfg.get(key), int):
      raise SystemExit(f"{flag}: {cfg_path}: '{key}' is missing or not an integer")
  return folder, sp, hf_cfg["vocab_size"], hf_cfg["max_position_embeddings"]
