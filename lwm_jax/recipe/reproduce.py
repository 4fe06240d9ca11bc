"""The recipe end to end on a corpus at CPU scale, every stage evaluated free-running: the logic
of `launch/reproduce.py` (`make reproduce`, docs/reproduce.md), over a config of
configs/reproduce.py (its fields are documented there).

  1. knowledge text: the pages the search environment indexes and the environments' action spaces,
     as plain documents (full loss) mixed into CPT at `knowledge_share` of its tokens
  2. a SentencePiece tokenizer on the training split (and the knowledge text)
  3. CPT with information-theoretic loss masking (masking="it") or full loss on every observation
     (masking="full"), exported to Hugging Face
  4. SFT from the CPT export, thinking targets on or off (thinking="on" | "off")
  5. (rl=True, off by default) GSPO from the SFT export
  6. free-running evaluation of every trained model on the test split beside copy-previous and
     empty; report.md, report.json and PNGs in the run folder

`ablations` ("masking,thinking,sft_loss") also trains the opposite setting of each switch at equal
compute (same model, steps, batch and sequence length) and reports it as a row. `run(config,
plan_only=True)` writes plan.json (the resolved settings and each run's config) and stops before
training.

This is the one library package that reads `configs` (the stage presets it fits to each run:
configs/stages.py, configs/rl.py); nothing in `configs` imports it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from typing import Any

import ml_collections

from configs import reproduce as reproduce_config, stages
from lwm_jax import hf, recipe, run_folder
from lwm_jax.data import corpus as corpus_lib
from lwm_jax.eval import episodes as episodes_lib

# LLVM at -O0 and the classic CPU emitters: about 3x cheaper compiles, slower steps (tests use it)
FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")
ABLATIONS = ("masking", "thinking", "sft_loss")
Settings = ml_collections.FrozenConfigDict  # a config of configs/reproduce.py, checked by resolve


def _err(field: str, message: str) -> ValueError:
  """An error naming the field as it is overridden on the command line."""
  sep = " " if message.startswith("must") else ": "
  return ValueError(f"--config.{field}{sep}{message}")


def resolve(config: ml_collections.ConfigDict) -> Settings:
  """`config` (configs/reproduce.py) checked, every error naming its field, with what it leaves
  implicit written out: the SFT rows (0: the CPT's), `knowledge` and `ablations` as tuples (no
  knowledge when its share is 0), drill rows normalised and the folders absolute."""
  v = dict(config)
  known = reproduce_config.get_config()  # every variant has the same fields
  bad_field = recipe.unknown_field(v, known, "configs/reproduce.py")
  if bad_field:
    raise ValueError(bad_field)
  ablations = tuple(a.strip() for a in str(v["ablations"]).split(",") if a.strip())
  bad = [a for a in ablations if a not in ABLATIONS]
  if bad:
    raise _err("ablations", f"{bad[0]!r} is not one of {', '.join(ABLATIONS)}")
  knowledge = tuple(k.strip() for k in str(v["knowledge"]).split(",") if k.strip())
  from lwm_jax.envs.knowledge import SOURCES  # pylint: disable=import-outside-toplevel
  bad = [k for k in knowledge if k not in SOURCES]
  if bad:
    raise _err("knowledge", f"{bad[0]!r} is not one of {', '.join(SOURCES)}")
  share = float(v["knowledge_share"]) if knowledge else 0.0
  if not 0.0 <= share < 1.0:
    raise _err("knowledge_share", f"must be in [0, 1), got {share}")
  for k in ("vocab", "seq_len", "batch", "cpt_steps", "sft_steps", "eval_max_new_tokens",
            "eval_batch", "rl_steps"):
    if int(v[k]) < 1:
      raise _err(k, f"must be >= 1, got {v[k]}")
  for k in ("sft_seq_len", "sft_batch"):
    if int(v[k]) < 0:
      raise _err(k, f"must be >= 0 (0: the CPT's), got {v[k]}")
  for k in ("cpt_lr", "sft_lr"):
    if float(v[k]) < 0:
      raise _err(k, f"must be >= 0 (0: the {k[:3].upper()} config's), got {v[k]}")
  if v["masking"] not in ("it", "full"):
    raise _err("masking", f"{v['masking']!r} is not it or full")
  if v["thinking"] not in ("on", "off"):
    raise _err("thinking", f"{v['thinking']!r} is not on or off")
  if v["sft_loss"] not in ("target", "history"):
    raise _err("sft_loss", f"{v['sft_loss']!r} is not target or history")
  if v["thinking"] == "on" and (v["sft_loss"] == "history" or "sft_loss" in ablations):
    raise ValueError("--config.sft_loss=history and the sft_loss ablation need "
                     "--config.thinking=off: in thinking mode the history replies are not "
                     "written like the target")
  if not 0.0 <= float(v["drill_share"]) < 1.0:
    raise _err("drill_share", f"must be in [0, 1), got {v['drill_share']}")
  from lwm_jax.data.drills import parse_drill_rows  # pylint: disable=import-outside-toplevel
  try:
    drill_rows = ",".join(map(str, parse_drill_rows(str(v["drill_rows"]) or "64")))
  except ValueError as e:
    raise _err("drill_rows", str(e)) from None
  if int(v["eval_max_turns"]) < 0:
    raise _err("eval_max_turns", f"must be >= 0 (0: every turn), got {v['eval_max_turns']}")
  v.update(sft_seq_len=int(v["sft_seq_len"] or v["seq_len"]),
           sft_batch=int(v["sft_batch"] or v["batch"]),
           knowledge=knowledge if share > 0 else (), knowledge_share=share, ablations=ablations,
           drill_share=float(v["drill_share"]), drill_rows=drill_rows,
           cpt_lr=float(v["cpt_lr"]), sft_lr=float(v["sft_lr"]),
           cpt_from=os.path.abspath(v["cpt_from"]) if v["cpt_from"] else "",
           more_worlds=",".join(os.path.abspath(p) for p in str(v["more_worlds"]).split(",")
                                if p))
  return ml_collections.FrozenConfigDict(v)


def context(s: Settings) -> int:
  """The trained models' context: the longest row any of their stages trained on."""
  return max(s.seq_len, s.sft_seq_len)


def settings(s: Settings) -> dict[str, Any]:
  """What the run trains and evaluates (every field but where it reads and writes): plan.json's,
  the report's and a shipped model's `settings`."""
  return {k: v for k, v in s.to_dict().items() if k not in reproduce_config.RUN_FIELDS}


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
  kept episodes of `more_worlds`) is trained on beside the corpus's training split."""
  if spec.stage == "rl":
    return _rl_config(spec, s, wd, tokenizer, vocab, corpus)
  c = stages.stage_config(
      spec.stage, preset=s.preset, vocab=vocab,
      steps=s.cpt_steps if spec.stage == "cpt" else s.sft_steps,
      batch=s.batch if spec.stage == "cpt" else s.sft_batch,
      seq_len=s.seq_len if spec.stage == "cpt" else s.sft_seq_len, context=context(s),
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
  c.model.max_position_embeddings = context(s)
  c.train.update(dict(num_steps=s.rl_steps, seq_len=context(s), eval_every=s.rl_steps))
  c.checkpoint.every = s.rl_steps
  c.init_from_hf = os.path.join(wd, spec.init_from, "hf")
  return c


def masking_coverage(trajs) -> dict[str, Any]:
  """How many training turns the information-theoretic mask keeps in the CPT loss (seed 0), and
  the turn classes: what separates masking="it" from masking="full" on this corpus."""
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
      raise SystemExit(f"--config.reuse_from: {n} is missing (a finished run folder of "
                       "launch/reproduce.py is expected)")
  with open(need[0]) as f:
    old_plan = json.load(f)
  with open(need[1]) as f:
    old_rows = json.load(f).get("stages", {})
  if old_plan["corpus"]["sha256"] != header["corpus"]["sha256"]:
    raise SystemExit(f"--config.reuse_from: {old} trained on corpus "
                     f"{old_plan['corpus']['sha256']}, "
                     f"this run uses {header['corpus']['sha256']}")
  sha = lambda plan: (plan.get("more_worlds") or {}).get("sha256")  # noqa: E731
  if sha(old_plan) != sha(header):
    raise SystemExit(f"--config.reuse_from: {old} trained on other --config.more_worlds episodes "
                     f"({sha(old_plan)} against {sha(header)})")
  as_json = lambda x: json.loads(json.dumps(x))  # tuples and lists compare alike  # noqa: E731
  for k in ("vocab", "knowledge", "knowledge_share"):
    a, b = old_plan["settings"].get(k), as_json(header["settings"].get(k))
    if a != b:
      raise SystemExit(f"--config.reuse_from: {old} has {k}={a!r}, this run {b!r}: its "
                       "tokenizer differs")
  out = {}
  for r in runs:   # in plan order, so a run's starting point is decided before the run
    c, name = configs[r.name], r.name
    prev = old_plan.get("configs", {}).get(name)
    if r.init_from and r.init_from not in out:
      continue     # its starting point is trained afresh, so it is too
    if prev is None or name not in old_rows or not os.path.isdir(
        os.path.join(old, name, "checkpoints")):
      print(f"--config.reuse_from: {old} has no finished {name}; it is trained")
    elif _plan_config(prev, old) != _plan_config(c.to_dict(), wd):
      print(f"--config.reuse_from: {name} of {old} was configured differently; it is trained")
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


def run(config: ml_collections.ConfigDict, *, plan_only: bool = False,
        command: str = "") -> None:
  """The whole run of `config` (configs/reproduce.py): every setting is checked before a folder
  is touched; with `plan_only`, plan.json is written and nothing trained. `command` is recorded
  as how the run was made (plan.json, the report, a ship's provenance.json)."""
  t0 = time.time()
  s = recipe.settings(config, resolve)
  runs = plan(s)
  if s.fast_compile:  # read when the XLA backend starts, which is later (first computation)
    flags_now = os.environ.get("XLA_FLAGS", "").split()
    os.environ["XLA_FLAGS"] = " ".join(flags_now + [f for f in FAST_COMPILE if f.split("=")[0]
                                                    not in {x.split("=")[0] for x in flags_now}])
  if s.rl:
    why = rl_available()
    if why:
      raise SystemExit(f"--config.rl: the RL stage cannot run here: {why}")
  try:  # every setting is checked before a folder is touched
    if s.ship:
      check_ship_dest(s.ship, s.overwrite)
    run_folder.check(s.workdir, "--config.workdir", s.overwrite)
    corpus = corpus_lib.load_corpus(s.corpus)
    wd = run_folder.prepare(s.workdir, "--config.workdir", s.overwrite)
  except ValueError as e:
    raise SystemExit(str(e)) from None
  header = {"command": command, "settings": settings(s),
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
    _, _, given_vocab, _ = corpus_lib.given_start(s.cpt_from, "--config.cpt_from")
    sp, tok, vocab = _copy_tokenizer(s.cpt_from, wd)
    if vocab != given_vocab:
      raise SystemExit(f"--config.cpt_from: {s.cpt_from}/config.json has vocab_size "
                       f"{given_vocab} but "
                       f"its tokenizer.model gives {vocab}")
  elif s.reuse_from:
    _banner(f"2. SentencePiece tokenizer ({s.vocab} pieces) of {s.reuse_from}")
    sp, tok, vocab = _copy_tokenizer(s.reuse_from, wd)
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
  if plan_only:
    print(f"plan written to {wd}/plan.json (plan only: nothing trained)")
    return

  reused = reusable(s.reuse_from, header, runs, configs, wd) if s.reuse_from else {}
  rows = {}
  for i, r in enumerate(runs, 3):
    _banner(f"{i}. {r.stage.upper()} {r.name} ({configs[r.name].train.num_steps} steps"
            + (f", from {r.init_from})" if r.init_from else ")")
            + (f": copied from {s.reuse_from}" if r.name in reused else ""))
    rows[r.name] = (_copy_run(s.reuse_from, wd, r, reused[r.name], configs[r.name])
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
  if s.ship:
    ship(os.path.join(wd, final.name, "hf"), s.ship, header, configs[final.name], res,
         final.name, simulated, s.overwrite)
  print(reproduce_report.summary(report))
  print(f"\ndone in {time.time() - t0:.0f} s; report in {wd}/report.md")


def check_ship_dest(dest: str, overwrite: bool) -> None:
  """ValueError unless `dest` may be replaced by a ship: missing or empty, made by a launcher, or
  an earlier ship (its provenance.json says how it was made); else only with `overwrite`."""
  prov = os.path.join(dest, "provenance.json")
  if os.path.isdir(dest) and not os.path.islink(dest) and os.path.isfile(prov):
    try:
      with open(prov) as f:
        if isinstance(json.load(f).get("made_by"), str):
          return
    except (OSError, ValueError, AttributeError):
      pass
  run_folder.check(dest, "--config.ship", overwrite)


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

