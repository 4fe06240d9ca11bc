"""What launch/demo.py and launch/reproduce.py share: the bundled corpus, the tokenizer and each
training stage's config (a preset of configs/{cpt,sft}.py with a run's data, steps and shapes)."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from configs import cpt as cpt_config, sft as sft_config  # noqa: E402
from lwm_jax.data import prompts, schema, splits, tokenizer as tok_lib  # noqa: E402

STAGE_CONFIGS = {"cpt": cpt_config, "sft": sft_config}


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
  with open(cfg_path) as f:
    hf_cfg = json.load(f)
  for key in ("vocab_size", "max_position_embeddings"):
    if not isinstance(hf_cfg.get(key), int):
      raise SystemExit(f"{flag}: {cfg_path}: '{key}' is missing or not an integer")
  return folder, sp, hf_cfg["vocab_size"], hf_cfg["max_position_embeddings"]


def stage_config(stage: str, *, preset: str, vocab: int, steps: int, batch: int, seq_len: int,
                 workdir: str, tokenizer: str, train: str, valid: str, init_from_hf: str = "",
                 export_hf: bool = False, loss_masking: bool = True, thinking: bool = True,
                 knowledge_jsonl: str = "", knowledge_share: float = 0.0, context: int = 0):
  """The `preset` of the stage's config (configs/common.py) with this run's data, steps,
  vocabulary and shapes; `loss_masking` (CPT) and `thinking` (SFT) are the recipe's switches.
  The model's context (max_position_embeddings) is `seq_len`, or `context` when larger."""
  c = STAGE_CONFIGS[stage].get_config(preset)
  c.model.vocab_size = vocab
  # The model's context is the longest row it was trained on: a sampler (free-running evaluation,
  # the simulated episode) then cuts history to fit it instead of feeding positions no row had.
  # (`context`, when the run's lineage trained on longer rows than this stage's).
  c.model.max_position_embeddings = max(seq_len, context)
  c.train.update(dict(num_steps=steps, batch_size=batch, seq_len=seq_len, eval_every=steps))
  c.checkpoint.every = steps
  c.data.source, c.data.tokenizer = "pipeline", tokenizer
  c.data.pipeline.jsonl, c.data.eval_jsonl = train, valid
  # The recipe drops SFT samples over the token limit; at a CPU-sized row of about 1,000 tokens
  # about 9 in 10 of the corpus's SFT samples are longer, so these runs keep them by dropping their
  # oldest history instead (a deliberate departure, see docs/recipe.md).
  c.data.pipeline.overlong = "truncate_history"
  if stage == "cpt":
    c.data.pipeline.loss_masking = loss_masking
    c.data.pipeline.knowledge_jsonl = knowledge_jsonl
    c.data.pipeline.knowledge_share = knowledge_share if knowledge_jsonl else 0.0
  else:
    c.data.pipeline.thinking = thinking
  c.init_from_hf = init_from_hf
  c.export_hf = export_hf
  c.export_hf_dir = os.path.join(workdir, "hf")
  return c


def simulated_episode(sampler, episode: schema.Trajectory, turns: int = 3,
                      max_new_tokens: int = 120, variant: int = 0, out=print) -> dict:
  """Lets the world model (a `Sampler`) play the environment for a real episode's first `turns`
  actions, its own earlier answers as history (`lwm_jax.sim.env.SimulatedEnv`), and prints each
  simulated observation beside the real one with their edit similarity. Returns the trajectory id,
  the per-turn similarities and their mean."""
  from lwm_jax.eval.metrics import edit_similarity  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling.params import SamplingParams  # pylint: disable=import-outside-toplevel
  from lwm_jax.sim.env import SimulatedEnv, World  # pylint: disable=import-outside-toplevel
  env = SimulatedEnv(sampler, World.from_trajectory(episode), variant=variant,
                     params=SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens))
  env.reset(seed=0)
  sims = []
  for i, turn in enumerate(episode.turns[:turns]):
    predicted = env.step(turn.action)
    sims.append(edit_similarity(predicted, turn.observation))
    out(f"--- turn {i + 1}: {turn.action}")
    out(beside(predicted, turn.observation))
    out(f"edit similarity {sims[-1]:.3f}")
  mean = sum(sims) / len(sims) if sims else 0.0
  out(f"mean edit similarity of the simulated observations to the real ones: {mean:.3f} over "
      f"{len(sims)} turns")
  return {"trajectory": episode.id, "turns": len(sims), "edit_similarity": sims,
          "mean_edit_similarity": mean}


def beside(simulated: str, real: str, width: int = 48, limit: int = 14) -> str:
  """Two columns, simulated | real, each line cut at `width` characters, at most `limit` lines."""
  cut = lambda text: [ln if len(ln) <= width else ln[:width - 3] + "..."
                      for ln in (text.splitlines() or [""])]
  left, right = cut(simulated), cut(real)
  rows = max(len(left), len(right))
  lines = [f"    {'simulated':<{width}} | real", f"    {'-' * width} | {'-' * width}"]
  for i in range(min(rows, limit)):
    a = left[i] if i < len(left) else ""
    b = right[i] if i < len(right) else ""
    lines.append(f"    {a:<{width}} | {b}")
  if rows > limit:
    lines.append(f"    ... {rows - limit} more lines")
  return "\n".join(lines)
