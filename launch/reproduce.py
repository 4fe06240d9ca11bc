"""The recipe end to end on the bundled corpus at CPU scale, every stage evaluated free-running
(`make reproduce`; docs/reproduce.md).

  1. knowledge text: the pages the search environment indexes and the environments' action spaces,
     as plain documents (full loss) mixed into CPT at --knowledge_share of its tokens
  2. a SentencePiece tokenizer on the training split (and the knowledge text)
  3. CPT with information-theoretic loss masking (--masking=it) or full loss on every observation
     (--masking=full), exported to Hugging Face
  4. SFT from the CPT export, thinking targets on or off (--thinking=on|off)
  5. (--rl, off by default) GSPO from the SFT export
  6. free-running evaluation of every trained model on the test split beside copy-previous and
     empty; report.md, report.json and PNGs in the run folder

--ablations=masking,thinking,sft_loss also trains the opposite setting of each switch at equal
compute (same model, steps, batch and sequence length) and reports it as a row. --budget picks the defaults
(tiny: an end-to-end smoke run in minutes; full: the 60-minute reproduction); every flag below
overrides its budget's value. --plan_only writes plan.json (the resolved settings and each run's
config) and stops before training.

  python launch/reproduce.py --budget=tiny --workdir=runs/reproduce_tiny
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import sys
import time
from typing import Any

from absl import app, flags
from absl import logging as absl_logging

from lwm_jax import hf, run_folder
from lwm_jax.data import corpus as corpus_lib
from lwm_jax.eval import episodes as episodes_lib
from configs import stages

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGETS: dict[str, dict[str, Any]] = {
    # end to end in a few minutes on 2 CPU cores: proves the plumbing, not the recipe. Compiling
    # dominates such a run, so it compiles with XLA's cheap settings (FAST_COMPILE) and skips the
    # training runs' validation pass.
    "tiny": dict(preset="tiny", vocab=1024, seq_len=512, batch=4, cpt_steps=8, sft_steps=4,
                 knowledge_share=0.1, ablations="", eval_max_turns=1, eval_max_new_tokens=16,
                 eval_batch=8, rl_steps=4, validate=False, fast_compile=True),
    # the 60-minute reproduction on 2 CPU cores (docs/reproduce.md)
    # (docs/reproduce.md says why these shapes): CPT rows of 2048 tokens carry each trajectory's
    # system prompt about half as often as rows of 1024, so 42% of their tokens are in the loss
    # against 24%; SFT rows stay at 1024, where its one target turn is twice the share of the row.
    # The ablations are their own budget (`ablation`), so this one spends the hour on the main
    # pipeline: 850 CPT steps and the thinking ablation ran 64 minutes (experiments/reproduce_full).
    # CPT takes 1600 steps: on idle cores (1.5-1.7 s a step) the whole run took 51 minutes and its
    # SFT model beat copy-previous in 5 of 7 domains (+8.4 points), where 1000 steps took 40 minutes
    # and were ahead in 4 of 7 (-0.7) and 2000 took 66 minutes, over the hour (7 of 7, +12.7;
    # experiments/reproduce_cpt1600, reproduce_cpt2000). SFT takes 300 steps:
    # from the same CPT, 150 left the reply format half learned and scored 35.9 token F1 against
    # 42.2 for 300 (docs/reproduce.md); the run with 300 took 101 minutes on a slow, partly shared
    # host (CPT at 4.1 s a step), so this budget fits the hour only on a quiet, fast one.
    # SFT targets without the (empty) thinking block: from the same CPT, 44.5 token F1 against
    # 42.2 with it on the 140 test turns, 44.2 against 41.8 on 420
    # (experiments/reproduce_thinking_full); --thinking=on trains the paper's thinking mode.
    "full": dict(preset="demo", vocab=2048, seq_len=2048, batch=4, sft_seq_len=1024, sft_batch=8,
                 cpt_steps=1600, sft_steps=300, knowledge_share=0.1, ablations="", thinking="off",
                 eval_max_turns=20, eval_max_new_tokens=320, eval_batch=32, rl_steps=24,
                 validate=True, fast_compile=False),
    # the ablations at equal compute, smaller than `full` (about 35 minutes): CPT with and without
    # information-theoretic masking and an SFT on each, and an SFT without thinking from the main
    # CPT; same shapes as `full`
    "ablation": dict(preset="demo", vocab=2048, seq_len=2048, batch=4, sft_seq_len=1024,
                     sft_batch=8, cpt_steps=200, sft_steps=60, knowledge_share=0.1,
                     ablations="masking,thinking", eval_max_turns=10, eval_max_new_tokens=320,
                     eval_batch=32, rl_steps=24, validate=True, fast_compile=False),
}
# LLVM at -O0 and the classic CPU emitters: about 3x cheaper compiles, slower steps (tests use it)
FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
ABLATIONS = ("masking", "thinking", "sft_loss")

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", os.path.join(ROOT, "runs", "reproduce"), "run folder (replaced "
                    "when this program made it, else refused unless --overwrite)")
flags.DEFINE_bool("overwrite", False, "replace --workdir (and --ship's folder) even when this "
                  "program did not make them")
flags.DEFINE_string("corpus", os.path.join(ROOT, "data", "corpus"), "bundled corpus folder")
flags.DEFINE_enum("budget", "full", list(BUDGETS), "defaults of every size flag below")
flags.DEFINE_string("preset", None, "model preset of configs/common.py (demo, tiny, small)")
flags.DEFINE_integer("vocab", None, "SentencePiece vocabulary size")
flags.DEFINE_integer("seq_len", None, "tokens per packed row")
flags.DEFINE_integer("batch", None, "rows per batch")
flags.DEFINE_integer("sft_seq_len", None, "tokens per SFT row (0: --seq_len)")
flags.DEFINE_integer("sft_batch", None, "rows per SFT batch (0: --batch)")
flags.DEFINE_integer("cpt_steps", None, "CPT steps")
flags.DEFINE_integer("sft_steps", None, "SFT steps")
flags.DEFINE_float("cpt_lr", None, "CPT peak learning rate (0: the CPT config's, 3e-3)")
flags.DEFINE_float("sft_lr", None, "SFT peak learning rate (0: the SFT config's, 1e-3)")
flags.DEFINE_enum("masking", "it", ["it", "full"], "CPT loss: information-theoretic masking or "
                  "full loss on every observation")
flags.DEFINE_enum("thinking", None, ["on", "off"], "SFT targets with or without a <think> "
                  "block (default: the budget's; `full` trains without, docs/reproduce.md)")
flags.DEFINE_string("knowledge", "search,actions", "knowledge text mixed into CPT: search "
                    "(the search environment's pages), actions (action spaces), copy (copy drills), "
                    "lookup (file-tree lookup drills; both lwm_jax/data/drills.py); '' for none")
flags.DEFINE_float("knowledge_share", None, "share of CPT tokens from the knowledge text")
flags.DEFINE_float("drill_share", 0.0, "share of CPT tokens from the copy drill (induction rows of "
                   "random ids, lwm_jax/data/drills.py), mixed into the same batches as the "
                   "trajectories; 0: none")
flags.DEFINE_string("drill_rows", "64", "row lengths of the copy drill in ids, comma list (e.g. "
                    "64,512: half its tokens in rows of each; far1536: far rows of 1536 ids, "
                    "copies up to 1536 ids from their sources)")
flags.DEFINE_enum("sft_loss", None, ["target", "history"], "SFT loss on the sample's target "
                  "observation only (the recipe) or on every observation of its kept history too "
                  "(--thinking=off only: there the history replies are written like the target)")
flags.DEFINE_string("ablations", None, "comma list of masking, thinking, sft_loss: also train "
                    "the other setting of each at equal compute")
flags.DEFINE_bool("rl", False, "add the GSPO stage after SFT (needs the RL stage's rollouts)")
flags.DEFINE_integer("rl_steps", None, "GSPO steps (with --rl)")
flags.DEFINE_integer("eval_max_turns", None, "test-split turns evaluated per domain (0: all)")
flags.DEFINE_integer("eval_max_new_tokens", None, "generated tokens per turn at most")
flags.DEFINE_integer("eval_batch", None, "turns generated together")
flags.DEFINE_integer("seed", 0, "seed of the turn sample")
flags.DEFINE_string("reuse_from", "", "an earlier run folder of this script: its tokenizer and "
                    "every run whose config (and starting point) equals this plan's are copied instead "
                    "of trained (e.g. an ablation or SFT variant from the same CPT); the report "
                    "marks them")
flags.DEFINE_string("cpt_from", "", "a trained model's Hugging Face folder with its tokenizer.model "
                    "(e.g. an earlier shipped world model): every CPT run continues from it, with "
                    "its tokenizer, instead of starting from random initialisation")
flags.DEFINE_string("more_worlds", "", "a corpus folder of more worlds (e.g. `make more-worlds`: "
                    "tools/make_corpus.py with another seed; several separated by commas) whose "
                    "episodes, every split, are "
                    "added to CPT and SFT training; an episode whose world is in --corpus's "
                    "validation or test split is dropped and counted")
flags.DEFINE_bool("plan_only", False, "write plan.json and stop before training")
flags.DEFINE_string("ship", "", "copy the final main model (its Hugging Face export) to this "
                    "folder with provenance.json (command, settings, corpus sha256, results); "
                    "`make world-model` ships data/world_model/ this way")

SIZE_FLAGS = ("preset", "vocab", "seq_len", "batch", "sft_seq_len", "sft_batch", "cpt_steps", "sft_steps", "cpt_lr", "sft_lr", "knowledge_share",
              "ablations", "eval_max_turns", "eval_max_new_tokens", "eval_batch", "rl_steps")


@dataclasses.dataclass
class Settings:
  budget: str
  preset: str
  vocab: int
  seq_len: int
  batch: int
  sft_seq_len: int
  sft_batch: int
  cpt_steps: int
  sft_steps: int
  masking: str
  thinking: str
  knowledge: tuple[str, ...]
  knowledge_share: float
  ablations: tuple[str, ...]
  rl: bool
  rl_steps: int
  eval_max_turns: int
  eval_max_new_tokens: int
  eval_batch: int
  cpt_lr: float = 0.0            # 0: the CPT config's peak learning rate
  sft_lr: float = 0.0            # 0: the SFT config's peak learning rate
  sft_loss: str = "target"       # target | history (pipeline.sft_history_loss)
  validate: bool = True          # validation loss at the end of each training run
  fast_compile: bool = False     # FAST_COMPILE XLA flags
  seed: int = 0
  cpt_from: str = ""             # Hugging Face folder the CPT runs start from ("": random init)
  more_worlds: str = ""          # corpus folder of more worlds added to training ("": none)
  drill_share: float = 0.0       # share of CPT tokens from the copy drill (0: none)
  drill_rows: str = "64"         # its row lengths, comma list

  @property
  def context(self) -> int:
    """The trained models' context: the longest row any of their stages trained on."""
    return max(self.seq_len, self.sft_seq_len)


def resolve(values: dict[str, Any]) -> Settings:
  """Settings from flag values: each size flag left at None takes its budget's value."""
  budget = values.get("budget") or "full"
  if budget not in BUDGETS:
    raise ValueError(f"--budget: {budget!r} is not one of {', '.join(BUDGETS)}")
  v = dict(BUDGETS[budget])
  v.update({k: values[k] for k in SIZE_FLAGS if values.get(k) is not None})
  ablations = tuple(a for a in str(v["ablations"]).split(",") if a.strip())
  bad = [a for a in ablations if a not in ABLATIONS]
  if bad:
    raise ValueError(f"--ablations: {bad[0]!r} is not one of {', '.join(ABLATIONS)}")
  knowledge = tuple(k for k in str(values.get("knowledge", "")).split(",") if k.strip())
  from lwm_jax.envs.knowledge import SOURCES  # pylint: disable=import-outside-toplevel
  bad = [k for k in knowledge if k not in SOURCES]
  if bad:
    raise ValueError(f"--knowledge: {bad[0]!r} is not one of {', '.join(SOURCES)}")
  share = float(v["knowledge_share"]) if knowledge else 0.0
  if not 0.0 <= share < 1.0:
    raise ValueError(f"--knowledge_share must be in [0, 1), got {share}")
  for k in ("vocab", "seq_len", "batch", "cpt_steps", "sft_steps", "eval_max_new_tokens",
            "eval_batch", "rl_steps"):
    if int(v[k]) < 1:
      raise ValueError(f"--{k} must be >= 1, got {v[k]}")
  for k in ("cpt_lr", "sft_lr"):
    if float(v.get(k) or 0.0) < 0:
      raise ValueError(f"--{k} must be >= 0 (0: the {k[:3].upper()} config's), got {v[k]}")
  thinking = values.get("thinking") or v.get("thinking", "on")
  sft_loss = values.get("sft_loss") or v.get("sft_loss", "target")
  if sft_loss not in ("target", "history"):
    raise ValueError(f"--sft_loss: {sft_loss!r} is not target or history")
  if thinking == "on" and (sft_loss == "history" or "sft_loss" in ablations):
    raise ValueError("--sft_loss=history and the sft_loss ablation need --thinking=off: in "
                     "thinking mode the history replies are not written like the target")
  drill_share = float(values.get("drill_share") or 0.0)
  if not 0.0 <= drill_share < 1.0:
    raise ValueError(f"--drill_share must be in [0, 1), got {drill_share}")
  from lwm_jax.data.drills import parse_drill_rows  # pylint: disable=import-outside-toplevel
  try:
    drill_rows = ",".join(map(str, parse_drill_rows(values.get("drill_rows") or "64")))
  except ValueError as e:
    raise ValueError(f"--drill_rows: {e}") from None
  if int(v["eval_max_turns"]) < 0:
    raise ValueError(f"--eval_max_turns must be >= 0 (0: every turn), got {v['eval_max_turns']}")
  return Settings(budget=budget, preset=str(v["preset"]), vocab=int(v["vocab"]),
                  seq_len=int(v["seq_len"]), batch=int(v["batch"]),
                  sft_seq_len=int(v.get("sft_seq_len") or v["seq_len"]),
                  sft_batch=int(v.get("sft_batch") or v["batch"]),
                  cpt_steps=int(v["cpt_steps"]), sft_steps=int(v["sft_steps"]),
                  masking=values.get("masking") or "it",
                  thinking=thinking,
                  knowledge=knowledge if share > 0 else (), knowledge_share=share,
                  ablations=ablations, rl=bool(values.get("rl")), rl_steps=int(v["rl_steps"]),
                  eval_max_turns=int(v["eval_max_turns"]),
                  eval_max_new_tokens=int(v["eval_max_new_tokens"]),
                  eval_batch=int(v["eval_batch"]), validate=bool(v["validate"]),
                  fast_compile=bool(v["fast_compile"]), seed=int(values.get("seed") or 0),
                  cpt_lr=float(v.get("cpt_lr") or 0.0), sft_lr=float(v.get("sft_lr") or 0.0),
                  sft_loss=sft_loss,
                  cpt_from=os.path.abspath(values["cpt_from"]) if values.get("cpt_from") else "",
                  more_worlds=",".join(os.path.abspath(p) for p in
                                       (values.get("more_worlds") or "").split(",") if p),
                  drill_share=drill_share, drill_rows=drill_rows)


def settings_from_flags() -> Settings:
  return resolve({k: FLAGS[k].value for k in ("budget", "masking", "thinking", "sft_loss",
                                              "knowledge", "rl",
                                              "seed", "cpt_from", "more_worlds", "drill_share",
                                              "drill_rows", *SIZE_FLAGS)})


@dataclasses.dataclass
class RunSpec:
  """One training run: its stage, its switches and the run it starts from."""
  name: str
  stage: str                  # cpt | sft | rl
  masking: str
  thinking: str
  init_from: str = ""         # the run whose Hugging Face export this one starts from
  main: bool = False          # on the main pipeline (the flags' settings), not an ablation
  sft_loss: str = "target"    # SFT: target | history


def _flip(value: str, a: str, b: str) -> str:
  return b if value == a else a


def plan(s: Settings) -> list[RunSpec]:
  """The runs in order: the main pipeline, then each ablation's extra runs (no run twice)."""
  cpt = lambda m: f"cpt_{m}"
  sft = lambda m, t, loss=s.sft_loss: (f"sft_{m}_{'think' if t == 'on' else 'nothink'}"
                                       f"{'_hist' if loss == 'history' else ''}")
  runs = [RunSpec(cpt(s.masking), "cpt", s.masking, s.thinking, main=True),
          RunSpec(sft(s.masking, s.thinking), "sft", s.masking, s.thinking, cpt(s.masking),
                  main=True, sft_loss=s.sft_loss)]
  if s.rl:
    runs.append(RunSpec("rl_" + runs[1].name, "rl", s.masking, s.thinking, runs[1].name,
                        main=True))
  if "masking" in s.ablations:
    m = _flip(s.masking, "it", "full")
    runs += [RunSpec(cpt(m), "cpt", m, s.thinking),
             RunSpec(sft(m, s.thinking), "sft", m, s.thinking, cpt(m), sft_loss=s.sft_loss)]
  if "thinking" in s.ablations:
    t = _flip(s.thinking, "on", "off")
    # thinking mode has no history loss: the counterpart trains on its target only
    loss = s.sft_loss if t == "off" else "target"
    runs.append(RunSpec(sft(s.masking, t, loss), "sft", s.masking, t, cpt(s.masking),
                        sft_loss=loss))
  if "sft_loss" in s.ablations:
    loss = _flip(s.sft_loss, "target", "history")
    runs.append(RunSpec(sft(s.masking, s.thinking, loss), "sft", s.masking, s.thinking,
                        cpt(s.masking), sft_loss=loss))
  return runs


def ablation_pairs(s: Settings, runs: list[RunSpec]) -> list[tuple[str, str, str]]:
  """(ablation, main run, its counterpart) for the report's ablation rows."""
  names = {r.name for r in runs}
  main_cpt, main_sft = runs[0].name, runs[1].name
  pairs = []
  if "masking" in s.ablations:
    m = _flip(s.masking, "it", "full")
    pairs += [("masking (CPT model)", main_cpt, f"cpt_{m}"),
              ("masking (after SFT)", main_sft, main_sft.replace(f"_{s.masking}_", f"_{m}_"))]
  if "thinking" in s.ablations:
    other = next(r.name for r in runs if r.stage == "sft" and not r.main
                 and r.masking == s.masking and r.thinking != s.thinking)
    pairs.append(("thinking (SFT)", main_sft, other))
  if "sft_loss" in s.ablations:
    other = next(r.name for r in runs if r.stage == "sft" and not r.main
                 and r.thinking == s.thinking and r.masking == s.masking
                 and r.sft_loss != s.sft_loss)
    pairs.append(("SFT loss on the history too (SFT)", main_sft, other))
  if s.rl:
    pairs.append(("GSPO after SFT", main_sft, "rl_" + main_sft))
  return [p for p in pairs if p[1] in names and p[2] in names]


def run_config(spec: RunSpec, s: Settings, wd: str, tokenizer: str, vocab: int,
               corpus: corpus_lib.Corpus, knowledge_jsonl: str, wants_export: bool,
               more_jsonl: str = ""):
  """The training config of one run (configs/stages.py builds CPT and SFT); `more_jsonl` (the
  kept episodes of --more_worlds) is trained on beside the corpus's training split."""
  if spec.stage == "rl":
    return _rl_config(spec, s, wd, tokenizer, vocab, corpus)
  c = stages.stage_config(
      spec.stage, preset=s.preset, vocab=vocab,
      steps=s.cpt_steps if spec.stage == "cpt" else s.sft_steps,
      batch=s.batch if spec.stage == "cpt" else s.sft_batch,
      seq_len=s.seq_len if spec.stage == "cpt" else s.sft_seq_len, context=s.context,
      workdir=os.path.join(wd, spec.name), tokenizer=tokenizer,
      train=",".join(corpus.train_files + ([more_jsonl] if more_jsonl else [])),
      valid=corpus.valid_jsonl,
      init_from_hf=(os.path.join(wd, spec.init_from, "hf") if spec.init_from
                    else s.cpt_from if spec.stage == "cpt" else ""),
      export_hf=wants_export, loss_masking=spec.masking == "it", thinking=spec.thinking == "on",
      knowledge_jsonl=knowledge_jsonl, knowledge_share=s.knowledge_share,
      drill_share=s.drill_share, drill_rows=s.drill_rows)
  stage_lr = {"cpt": s.cpt_lr, "sft": s.sft_lr}.get(spec.stage)  # 0 / None: the config's own
  if stage_lr:
    c.optim.lr = stage_lr
  if spec.stage == "sft":
    c.data.pipeline.sft_history_loss = spec.sft_loss == "history"
  if not s.validate:
    c.train.eval_every = 0
  return c


def rl_available() -> str:
  """'' when this checkout's RL stage trains on rollouts of the corpus, else why not."""
  import importlib.util  # pylint: disable=import-outside-toplevel
  from configs import rl as rl_cfg  # pylint: disable=import-outside-toplevel
  if importlib.util.find_spec("lwm_jax.rl.stage") is None:
    return "lwm_jax/rl/stage.py (the rollout source) is not in this checkout"
  if rl_cfg.get_config("demo").data.source != "rollouts":
    return "configs/rl.py's demo preset does not train on rollouts in this checkout"
  return ""


def _rl_config(spec: RunSpec, s: Settings, wd: str, tokenizer: str, vocab: int,
               corpus: corpus_lib.Corpus):
  from configs import rl as rl_cfg  # pylint: disable=import-outside-toplevel
  c = rl_cfg.get_config("demo")
  c.model.vocab_size = vocab
  # CPT and SFT trained on every training trajectory, so GSPO's prompts come from the validation
  # split (all of it), which no earlier stage has seen
  c.data.tokenizer, c.data.pipeline.jsonl = tokenizer, corpus.valid_jsonl
  c.rl.pool_fractions = "rl=1.0"
  c.model.max_position_embeddings = s.context
  c.train.update(dict(num_steps=s.rl_steps, seq_len=s.context, eval_every=s.rl_steps))
  c.checkpoint.every = s.rl_steps
  c.init_from_hf = os.path.join(wd, spec.init_from, "hf")
  return c


def masking_coverage(trajs) -> dict[str, Any]:
  """How many training turns the information-theoretic mask keeps in the CPT loss (seed 0), and
  the turn classes: what separates --masking=it from --masking=full on this corpus."""
  from lwm_jax.data import masking  # pylint: disable=import-outside-toplevel
  classes: dict[str, int] = {}
  kept = total = 0
  for t in trajs:
    for k, turn in enumerate(t.turns):
      c = masking.classify_turn(turn.action, turn.observation).value
      classes[c] = classes.get(c, 0) + 1
      kept += masking.keep_turn(t.id, k, turn.action, turn.observation, 0)
      total += 1
  return {"turns": total, "kept": kept, "classes": dict(sorted(classes.items()))}


def _relocated(obj: Any, wd: str, to: str = "WD") -> str:
  """`obj` as JSON with every path under the run folder `wd` (relative or absolute) under `to`."""
  text = json.dumps(obj, sort_keys=True, default=str)
  for form in (os.path.abspath(wd), os.path.normpath(wd)):
    text = text.replace(form + "/", to + "/")
  return text


def _plan_config(cfg: dict[str, Any], wd: str) -> str:
  """A run's config as JSON with its run folder written as WD: equal for equal runs anywhere."""
  # whether a run writes its Hugging Face export is not part of what it trains (a copied run that
  # lacks one is exported from its checkpoint: `_copy_run`)
  return _relocated({k: v for k, v in cfg.items() if k != "export_hf"}, wd)


def reusable(old: str, header: dict[str, Any], runs: list[RunSpec], configs: dict[str, Any],
             wd: str) -> dict[str, dict[str, Any]]:
  """{run name: its report row} of the earlier run folder `old` that this plan can copy: same
  corpus, same tokenizer settings, an equal config and a starting point that is copied too. What
  cannot be reused is said and trained afresh; a folder that is not a finished run of this script
  (with its Hugging Face exports) is an error."""
  need = [os.path.join(old, n) for n in ("plan.json", "report.json", "tokenizer.model")]
  for n in need:
    if not os.path.isfile(n):
      raise SystemExit(f"--reuse_from: {n} is missing (a finished run folder of "
                       "launch/reproduce.py is expected)")
  with open(need[0]) as f:
    old_plan = json.load(f)
  with open(need[1]) as f:
    old_rows = json.load(f).get("stages", {})
  if old_plan["corpus"]["sha256"] != header["corpus"]["sha256"]:
    raise SystemExit(f"--reuse_from: {old} trained on corpus {old_plan['corpus']['sha256']}, "
                     f"this run uses {header['corpus']['sha256']}")
  sha = lambda plan: (plan.get("more_worlds") or {}).get("sha256")  # noqa: E731
  if sha(old_plan) != sha(header):
    raise SystemExit(f"--reuse_from: {old} trained on other --more_worlds episodes "
                     f"({sha(old_plan)} against {sha(header)})")
  as_json = lambda x: json.loads(json.dumps(x))  # tuples and lists compare alike  # noqa: E731
  for k in ("vocab", "knowledge", "knowledge_share"):
    a, b = old_plan["settings"].get(k), as_json(header["settings"].get(k))
    if a != b:
      raise SystemExit(f"--reuse_from: {old} has {k}={a!r}, this run {b!r}: its tokenizer differs")
  out = {}
  for r in runs:   # in plan order, so a run's starting point is decided before the run
    c, name = configs[r.name], r.name
    prev = old_plan.get("configs", {}).get(name)
    if r.init_from and r.init_from not in out:
      continue     # its starting point is trained afresh, so it is too
    if prev is None or name not in old_rows or not os.path.isdir(
        os.path.join(old, name, "checkpoints")):
      print(f"--reuse_from: {old} has no finished {name}; it is trained")
    elif _plan_config(prev, old) != _plan_config(c.to_dict(), wd):
      print(f"--reuse_from: {name} of {old} was configured differently; it is trained")
    else:
      out[name] = old_rows[name]
  return out


def _copy_tokenizer(old: str, wd: str) -> tuple[str, object, int]:
  for ext in (".model", ".vocab"):
    if os.path.isfile(os.path.join(old, "tokenizer" + ext)):
      shutil.copy(os.path.join(old, "tokenizer" + ext), os.path.join(wd, "tokenizer" + ext))
  return corpus_lib.load_tokenizer(os.path.join(wd, "tokenizer.model"))


def _copy_run(old: str, wd: str, spec: RunSpec, row: dict[str, Any], c) -> dict[str, Any]:
  """Copies run `spec.name` of `old` into `wd` with its report row (its place in this plan, which
  an equal config does not fix: a copied run may have been an ablation); with its config `c`
  asking for a Hugging Face export the old run did not write, exports its last checkpoint as
  training would have."""
  name = spec.name
  shutil.copytree(os.path.join(old, name), os.path.join(wd, name))
  row = json.loads(_relocated(row, old, os.path.normpath(wd)))
  row.update(reused_from=os.path.join(old, name), main=spec.main)
  if c.export_hf and not os.path.isdir(c.export_hf_dir):
    from lwm_jax import checkpoints, hf  # pylint: disable=import-outside-toplevel
    model, _ = checkpoints.load(os.path.join(wd, name), tokenizer=c.data.tokenizer)
    hf.save_pretrained(model, c.export_hf_dir, tokenizer=c.data.tokenizer,
                       generation=c.init_from_hf or None)
    row["export_hf"] = c.export_hf_dir
  return row


# --- running ----------------------------------------------------------------------------------
def _banner(text: str) -> None:
  print(f"\n=== {text} ===", flush=True)


def _train(spec: RunSpec, c, wd: str) -> dict[str, Any]:
  """Trains one run on its configured data; returns the report's row (data counts included)."""
  from lwm_jax.train import run_config as rc, sources as src  # pylint: disable=C0415
  from lwm_jax.train import trainer  # pylint: disable=import-outside-toplevel
  out = os.path.join(wd, spec.name)
  t0 = time.time()
  if spec.stage == "rl":
    from lwm_jax.rl import stage as rl_stage  # pylint: disable=import-outside-toplevel
    summary = trainer.train(c, out, source=rl_stage.rollout_source(c))
    stats: dict[str, Any] = {}
  else:
    source, evals, _ = src.pipeline_source(c, rc.validate_config(c), c.stage)
    summary = trainer.train(c, out, source=source, eval_source=evals)
    stats = dict(source.it.stats)
  losses = summary.get("losses") or [float("nan")]
  return {"name": spec.name, "stage": spec.stage,
          "from": spec.init_from or c.init_from_hf or "(random init)",
          "masking": spec.masking, "thinking": spec.thinking, "main": spec.main,
          "sft_loss": spec.sft_loss if spec.stage == "sft" else None,
          "steps": summary.get("final_step"), "batch": c.train.batch_size,
          "seq_len": c.train.seq_len, "data": stats, "loss_first": losses[0],
          "loss_last": losses[-1], "eval": summary.get("eval"),
          "tokens_per_s": summary.get("tokens_per_s"), "seconds": round(time.time() - t0, 1),
          "loss_png": summary.get("loss_png"), "export_hf": summary.get("export_hf"),
          "config": c.to_dict()}


def _evaluate(spec: RunSpec, wd: str, s: Settings, test):
  """Free-running predictions of one trained run, prompted the way its stage was trained
  (`free_running.prompting`: a CPT model in its own template, behind the observation header)."""
  from lwm_jax.eval import free_running  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling import Sampler  # pylint: disable=import-outside-toplevel
  name = spec.name
  variant, prefix = free_running.prompting(spec.stage)
  selection = _selection(test, s, variant)
  sampler = Sampler.from_checkpoint(os.path.join(wd, name))
  done = lambda i, n: print(f"\r  {name}: {i}/{n} turns", end="", flush=True)
  preds, stats = free_running.generate(sampler, selection.cases, s.eval_max_new_tokens,
                                       s.eval_batch, progress=done, reply_prefix=prefix)
  print(flush=True)
  free_running.write_predictions(selection.cases, preds,
                                 os.path.join(wd, "predictions", f"{name}.jsonl"))
  return preds, stats, sampler


def main(argv):
  del argv
  logging.getLogger().setLevel(logging.WARNING)
  absl_logging.set_verbosity(absl_logging.WARNING)
  t0 = time.time()
  s = settings_from_flags()
  runs = plan(s)
  if s.fast_compile:  # read when the XLA backend starts, which is later (first computation)
    flags_now = os.environ.get("XLA_FLAGS", "").split()
    os.environ["XLA_FLAGS"] = " ".join(flags_now + [f for f in FAST_COMPILE if f.split("=")[0]
                                                    not in {x.split("=")[0] for x in flags_now}])
  if s.rl:
    why = rl_available()
    if why:
      raise SystemExit(f"--rl: the RL stage cannot run here: {why}")
  try:  # every flag is checked before a folder is touched
    if FLAGS.ship:
      check_ship_dest(FLAGS.ship, FLAGS.overwrite)
    run_folder.check(FLAGS.workdir, "--workdir", FLAGS.overwrite)
    corpus = corpus_lib.load_corpus(FLAGS.corpus)
    wd = run_folder.prepare(FLAGS.workdir, "--workdir", FLAGS.overwrite)
  except ValueError as e:
    raise SystemExit(str(e)) from None
  header = {"command": " ".join(sys.argv), "settings": dataclasses.asdict(s),
            "corpus": {"folder": corpus.folder, "sha256": corpus.digest(),
                       "train_trajectories": len(corpus.train),
                       "test_trajectories": len(corpus.test)},
            "runs": [dataclasses.asdict(r) for r in runs],
            "masking": masking_coverage(corpus.train)}
  print(f"corpus: {len(corpus.train)} training trajectories, {len(corpus.test)} held out; "
        f"runs: {', '.join(r.name for r in runs)}")

  knowledge_jsonl, knowledge_info, extra_texts = "", None, []
  if s.knowledge:
    from lwm_jax.data import documents  # pylint: disable=import-outside-toplevel
    from lwm_jax.envs import knowledge  # pylint: disable=import-outside-toplevel
    _banner(f"1. Knowledge text ({', '.join(s.knowledge)}) at {s.knowledge_share:.0%} of CPT")
    docs = knowledge.knowledge_documents(sources=s.knowledge)
    knowledge_jsonl = os.path.join(wd, "knowledge.jsonl.gz")
    documents.write_documents(docs, knowledge_jsonl)
    knowledge_info = {"file": knowledge_jsonl, "documents": len(docs),
                      "characters": sum(len(d.full_text()) for d in docs)}
    extra_texts = [d.full_text() for d in docs]
    print(f"{len(docs)} documents, {knowledge_info['characters']} characters")

  more_jsonl = ""
  if s.more_worlds:
    more_jsonl = os.path.join(wd, "more_worlds.jsonl")
    header["more_worlds"] = more = corpus_lib.more_worlds(s.more_worlds, corpus, more_jsonl)
    print(f"more worlds ({s.more_worlds}): {more['trajectories']} episodes of {more['worlds']} "
          f"worlds ({more['worlds_new']} not in the corpus's training split) added to training; "
          f"{more['dropped_held_out_world']} dropped, their world being held out")

  if s.cpt_from:
    _banner(f"2. SentencePiece tokenizer of {s.cpt_from} (the CPT runs continue from it)")
    _, _, given_vocab, _ = corpus_lib.given_start(s.cpt_from, "--cpt_from")
    sp, tok, vocab = _copy_tokenizer(s.cpt_from, wd)
    if vocab != given_vocab:
      raise SystemExit(f"--cpt_from: {s.cpt_from}/config.json has vocab_size {given_vocab} but "
                       f"its tokenizer.model gives {vocab}")
  elif FLAGS.reuse_from:
    _banner(f"2. SentencePiece tokenizer ({s.vocab} pieces) of {FLAGS.reuse_from}")
    sp, tok, vocab = _copy_tokenizer(FLAGS.reuse_from, wd)
  else:
    _banner(f"2. SentencePiece tokenizer ({s.vocab} pieces)")
    sp, tok, vocab = corpus_lib.train_tokenizer(corpus.train, s.vocab, os.path.join(wd, "tokenizer"),
                                            extra_texts)
  print(f"{sp}: {tok.vocab_size} pieces")
  final = [r for r in runs if r.main][-1]   # the main pipeline's last model: always exported
  exports = {r.init_from for r in runs if r.init_from} | {final.name}
  configs = {r.name: run_config(r, s, wd, sp, vocab, corpus, knowledge_jsonl, r.name in exports,
                                more_jsonl) for r in runs}
  header.update(knowledge=knowledge_info, tokenizer=sp,
                configs={k: c.to_dict() for k, c in configs.items()})
  with open(os.path.join(wd, "plan.json"), "w") as f:
    json.dump(header, f, indent=2, default=str)
  if FLAGS.plan_only:
    print(f"plan written to {wd}/plan.json (--plan_only: nothing trained)")
    return

  reused = reusable(FLAGS.reuse_from, header, runs, configs, wd) if FLAGS.reuse_from else {}
  rows = {}
  for i, r in enumerate(runs, 3):
    _banner(f"{i}. {r.stage.upper()} {r.name} ({configs[r.name].train.num_steps} steps"
            + (f", from {r.init_from})" if r.init_from else ")")
            + (f": copied from {FLAGS.reuse_from}" if r.name in reused else ""))
    rows[r.name] = (_copy_run(FLAGS.reuse_from, wd, r, reused[r.name], configs[r.name])
                    if r.name in reused else _train(r, configs[r.name], wd))
    row = rows[r.name]
    print(f"loss {row['loss_first']:.3f} -> {row['loss_last']:.3f}; "
          f"{row['tokens_per_s'] or 0:.0f} tokens/s; {row['seconds']:.0f} s")

  from lwm_jax.eval import free_running  # pylint: disable=import-outside-toplevel
  _banner("Free-running evaluation on the test split")
  selection = _selection(corpus.test, s, free_running.EVAL_VARIANT)
  print(selection.describe())
  preds, gen, main_sampler = {}, {}, None
  for r in runs:
    p, gen[r.name], sampler = _evaluate(r, wd, s, corpus.test)
    preds[r.name] = {k: v["prediction"] for k, v in p.items()}
    rows[r.name]["cut_per_domain"] = _cut_per_domain(selection, p)
    if r.main and r.stage == "sft":
      main_sampler = sampler
  res = free_running.results(selection, preds, gen, train=corpus.train)
  paths = free_running.write_report(res, wd, title="Free-running evaluation (test split)")

  simulated = None
  if main_sampler is not None and any(t.domain == "terminal" for t in corpus.test):
    _banner(f"Simulated terminal episodes ({runs[1].name} plays the environment)")
    lines: list[str] = []
    out = lambda text: (print(text), lines.append(text))
    simulated = episodes_lib.simulated_terminal_episodes(main_sampler, corpus.test,
                                                   s.eval_max_new_tokens, out)
    simulated.update(model=runs[1].name, transcript="\n".join(lines))

  from lwm_jax.eval import recipe_report as reproduce_report  # pylint: disable=import-outside-toplevel
  report = reproduce_report.build(header, rows, res, ablation_pairs(s, runs),
                                  round(time.time() - t0, 1), paths, simulated)
  reproduce_report.write(report, wd)
  if FLAGS.ship:
    ship(os.path.join(wd, final.name, "hf"), FLAGS.ship, header, configs[final.name], res,
         final.name, simulated, FLAGS.overwrite)
  print(reproduce_report.summary(report))
  print(f"\ndone in {time.time() - t0:.0f} s; report in {wd}/report.md")


def check_ship_dest(dest: str, overwrite: bool) -> None:
  """ValueError unless `dest` may be replaced by a ship: missing or empty, made by a launcher, or
  an earlier ship (its provenance.json says how it was made); else only with --overwrite."""
  prov = os.path.join(dest, "provenance.json")
  if os.path.isdir(dest) and not os.path.islink(dest) and os.path.isfile(prov):
    try:
      with open(prov) as f:
        if isinstance(json.load(f).get("made_by"), str):
          return
    except (OSError, ValueError, AttributeError):
      pass
  run_folder.check(dest, "--ship", overwrite)


def ship(export: str, dest: str, header: dict, config, res: dict, name: str,
         simulated: dict | None, overwrite: bool = False) -> None:
  """Copies a run's Hugging Face export to `dest` (replaced) beside provenance.json: how it was
  made (command, settings, corpus sha256, its training config) and what it scored."""
  from lwm_jax.eval import free_running  # pylint: disable=import-outside-toplevel
  from lwm_jax.checkpoints import read_provenance  # pylint: disable=import-outside-toplevel
  given = header["settings"].get("cpt_from")
  # read before `dest` is replaced: a chain may ship where it started from
  earlier = read_provenance(given) if given else None
  check_ship_dest(dest, overwrite)
  shutil.rmtree(dest, ignore_errors=True)
  shutil.copytree(export, dest)
  vs = free_running.versus(res, name)
  prov = {"model": name, "made_by": header["command"], "settings": header["settings"],
          "corpus": header["corpus"], "more_worlds": header.get("more_worlds"),
          "config": config.to_dict(),
          "free_running": {sys_: {m: v["overall"] for m, v in res["systems"][sys_]["free"].items()
                                  if isinstance(v, dict) and "overall" in v}
                           for sys_ in (name, "copy_previous")},
          "token_f1_vs_copy_previous": vs,
          "simulated_episode": {k: v for k, v in (simulated or {}).items() if k != "transcript"}}
  if given:  # the model its CPT continued from, with how that one was made (a chain of runs)
    prov["cpt_from"] = {"folder": given, "provenance": earlier}
  with open(os.path.join(dest, "provenance.json"), "w") as f:
    json.dump(prov, f, indent=2, default=str)
  hf.write_checksums(dest)  # the weights, config and tokenizer as shipped
  size = sum(os.path.getsize(os.path.join(dest, n)) for n in os.listdir(dest))
  print(f"shipped {name} to {dest} ({size / 2**20:.1f} MiB)")


def _selection(test, s: Settings, variant: int):
  """The evaluated test turns in template `variant` (the same turns for every variant)."""
  from lwm_jax.eval import free_running  # pylint: disable=import-outside-toplevel
  return free_running.select_cases(test, s.eval_max_turns or None, s.seed, variant)


def _cut_per_domain(selection, preds) -> dict[str, int]:
  out: dict[str, int] = {}
  for c in selection.cases:
    if preds[c.key]["finish_reason"] == "length":
      out[c.domain] = out.get(c.domain, 0) + 1
  return out


if __name__ == "__main__":
  app.run(main)
