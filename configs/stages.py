"""A recipe stage's config: a preset of configs/{cpt,sft}.py with a run's data, steps and shapes
(what launch/demo.py, lwm_jax/recipe/reproduce.py and the experiments train)."""
from __future__ import annotations

import os

from configs import cpt as cpt_config, sft as sft_config

STAGE_CONFIGS = {"cpt": cpt_config, "sft": sft_config}


def stage_config(stage: str, *, preset: str, vocab: int, steps: int, batch: int, seq_len: int,
                 workdir: str, tokenizer: str, train: str, valid: str, init_from_hf: str = "",
                 export_hf: bool = False, loss_masking: bool = True, thinking: bool = True,
                 knowledge_jsonl: str = "", knowledge_share: float = 0.0, context: int = 0,
                 drill_share: float = 0.0, drill_rows: str = "64", thinking_target: str = ""):
  """The `preset` of the stage's config (configs/common.py) with this run's data, steps,
  vocabulary and shapes; `loss_masking` (CPT) and `thinking` (SFT) are the recipe's switches
  (`thinking_target`, when given, what an SFT think block holds: configs/common.py);
  `drill_share` / `drill_rows` mix the copy drill into CPT (lwm_jax/data/pipeline.py).
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
    c.data.pipeline.drill_share, c.data.pipeline.drill_rows = drill_share, drill_rows
  else:
    c.data.pipeline.thinking = thinking
    if thinking_target:
      c.data.thinking_target = thinking_target
  c.init_from_hf = init_from_hf
  c.export_hf = export_hf
  c.export_hf_dir = os.path.join(workdir, "hf")
  return c


def demo_config(stage: str, *, vocab: int, steps: int, batch: int, seq_len: int, workdir: str,
                tokenizer: str, train: str, valid: str, init_from_hf: str = ""):
  """The demo's config of a stage: the `demo` preset with this run's data and shapes, CPT
  exported as a Hugging Face folder for SFT to start from (launch/demo.py,
  benchmarks/long_prompts.py)."""
  return stage_config(stage, preset="demo", vocab=vocab, steps=steps, batch=batch,
                      seq_len=seq_len, workdir=workdir, tokenizer=tokenizer, train=train,
                      valid=valid, init_from_hf=init_from_hf, export_hf=stage == "cpt")


# The demo's data and shapes, shared by launch/demo.py and benchmarks/long_prompts.py.
DEMO_FLAGS = (("vocab", 2048, "SentencePiece vocabulary size"),
              ("cpt_steps", 80, "CPT steps"),
              ("sft_steps", 40, "SFT steps"),
              ("seq_len", 1024, "tokens per packed row"),
              ("batch", 8, "rows per batch"),
              ("eval_trajectories", 70, "held-out trajectories for the accuracy table"))


def define_demo_flags() -> None:
  """Defines DEMO_FLAGS as absl integer flags (a script that runs the demo's stages)."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  for name, default, help_text in DEMO_FLAGS:
    flags.DEFINE_integer(name, default, help_text)


def demo_config_from_flags(stage: str, vocab: int, steps: int, workdir: str, tokenizer: str,
                           train: str, valid: str, init_from_hf: str = ""):
  """`demo_config` with the batch and row length of the parsed demo flags."""
  from absl import flags  # pylint: disable=import-outside-toplevel
  f = flags.FLAGS
  return demo_config(stage, vocab=vocab, steps=steps, batch=f.batch, seq_len=f.seq_len,
                     workdir=workdir, tokenizer=tokenizer, train=train, valid=valid,
                     init_from_hf=init_from_hf)
