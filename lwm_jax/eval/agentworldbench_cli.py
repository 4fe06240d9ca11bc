"""AgentWorldBench evaluation: `infer`, `judge`, `score` (or `all`), each resumable.

This is the command line behind `evals/agentworldbench.py` (the script only calls `main`); `evals/`
also holds the bundled mini benchmark (`evals/mini_bench/`).
The library it drives is `lwm_jax/eval/` (inference, judge, scoring, reports) and the record
format is `lwm_jax/data/bench_records.py`.

  # a hosted or served model (any OpenAI-compatible endpoint), judged by another endpoint
  python evals/agentworldbench.py infer --data=AgentWorldBench/ --out=runs/awb \
      --endpoint=http://localhost:8000/v1 --model=Qwen/Qwen-AgentWorld-35B-A3B
  python evals/agentworldbench.py judge --data=AgentWorldBench/ --out=runs/awb \
      --judge_endpoint=https://api.example.com/v1 --judge_model=some-judge
  python evals/agentworldbench.py score --data=AgentWorldBench/ --out=runs/awb

  # the official judge protocol, with the prompts/ folder of a Qwen-AgentWorld checkout
  python evals/agentworldbench.py judge --data=AgentWorldBench/ --out=runs/awb \
      --judge_endpoint=URL/v1 --judge_model=NAME --judge_style=official \
      --judge_prompts=Qwen-AgentWorld/prompts --drop_empty

  # our own checkpoint through lwm_jax.sampling.Sampler
  python evals/agentworldbench.py all --data=evals/mini_bench --out=runs/mini --checkpoint=ckpt/

  # the official client's files (QwenLM/Qwen-AgentWorld eval.py) into our judge and score
  python evals/agentworldbench.py score --data=evals/mini_bench --out=runs/x \
      --import_predictions=results/predictions.jsonl --import_judged=results/judged.jsonl \
      --system=my-model
  # ours out, in the official shapes (for its `judge` and `score` steps)
  python evals/agentworldbench.py export --data=evals/mini_bench --out=runs/mini

`--data` is a `{domain}_test.jsonl` file or a directory of them. `infer` also writes the baselines
(copy-previous-observation, empty; both names are reserved); `judge` judges every system found
under `--out` (baselines included unless --nojudge_baselines); `score` writes scores.md,
scores.json and scores_*.png; `export` writes `official/{system}_predictions.jsonl` (and
`_judged.jsonl`) in the official client's row shapes. Prediction and judged files may be ours or
the official client's (`--row_format`, sniffed by default). API keys come from the environment
variables named by --api_key_env / --judge_api_key_env.
"""
from __future__ import annotations

import filecmp
import logging
import os
import shutil
import sys

from absl import app, flags


from lwm_jax.eval import inference as A
from lwm_jax.eval import official
from lwm_jax.eval import records as R
from lwm_jax.eval import report
from lwm_jax.eval.judge import run_judging
from lwm_jax.judge import STYLES, make_style
from lwm_jax.sampling.backends import Backend, OpenAIBackend, SamplerBackend

STEPS = ("infer", "judge", "score", "all", "export")

_DATA = flags.DEFINE_string("data", None, "A {domain}_test.jsonl file or a directory of them.")
_OUT = flags.DEFINE_string("out", None, "Run directory (predictions/, judged/, scores.*).")
_DOMAINS = flags.DEFINE_list("domains", None, "Only these domains (default: all in --data).")
_LIMIT = flags.DEFINE_integer("limit", None, "Only the first N samples of each domain.")
_PROGRESS = flags.DEFINE_bool("progress", True, "Show progress bars.")
# the model under test
_CHECKPOINT = flags.DEFINE_string("checkpoint", None, "Our checkpoint directory (local Sampler).")
_ENDPOINT = flags.DEFINE_string("endpoint", None, "OpenAI-compatible base URL, e.g. .../v1.")
_MODEL = flags.DEFINE_string("model", None, "Model name sent to --endpoint.")
_SYSTEM = flags.DEFINE_string("system", None, "Name of the system in reports (default: model).")
_API_KEY_ENV = flags.DEFINE_string("api_key_env", "OPENAI_API_KEY",
                                   "Environment variable holding the endpoint's API key.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.6, "Sampling temperature.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", 32768, "Most new tokens per prediction.")
_CONCURRENCY = flags.DEFINE_integer("concurrency", 8, "Requests in flight to --endpoint.")
_RETRIES = flags.DEFINE_integer("retries", 5, "Retries per request (connection errors, 429, 5xx).")
_TIMEOUT = flags.DEFINE_float("timeout_s", 600.0, "Timeout per HTTP request.")
_BATCH = flags.DEFINE_integer("batch_size", 8, "Conversations per Sampler call (--checkpoint).")
_DECODE_DTYPE = flags.DEFINE_string(
    "decode_dtype", "", "Local Samplers: decode weight dtype, e.g. bfloat16 (faster on CPU; logits "
    "within bfloat16 rounding). '' keeps the checkpoint's.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
# the judge
_J_CHECKPOINT = flags.DEFINE_string("judge_checkpoint", None, "Judge checkpoint (local Sampler).")
_J_ENDPOINT = flags.DEFINE_string("judge_endpoint", None, "Judge OpenAI-compatible base URL.")
_J_MODEL = flags.DEFINE_string("judge_model", None, "Judge model name.")
_J_API_KEY_ENV = flags.DEFINE_string("judge_api_key_env", "OPENAI_API_KEY",
                                     "Environment variable holding the judge's API key.")
_J_TEMPERATURE = flags.DEFINE_float("judge_temperature", 0.6,
                                    "Judge temperature; negative leaves it out of requests.")
_J_MAX_TOKENS = flags.DEFINE_integer("judge_max_tokens", 32768, "Most judge tokens.")
_J_CONCURRENCY = flags.DEFINE_integer("judge_concurrency", 8, "Judge requests in flight.")
_J_RETRIES = flags.DEFINE_integer("judge_retries", 2, "Extra judge calls when a reply is unusable.")
_J_CONTEXT = flags.DEFINE_integer("judge_context_chars", None,
                                  "Keep only the last N characters of history for the judge.")
_J_STYLE = flags.DEFINE_enum("judge_style", "rubric", STYLES,
                              "rubric: our judge prompt; official: the official client's protocol "
                              "with the prompts in --judge_prompts.")
_J_PROMPTS = flags.DEFINE_string("judge_prompts", None,
                                 "Directory laid out like the official repository's prompts/ "
                                 "({domain}/judge_system_prompt.txt), for --judge_style=official.")
_J_CLIENT = flags.DEFINE_string(
    "official_client", None, "Root of a checkout of the official Qwen-AgentWorld repository: "
    "the judge request and the reply parsing are then its own code's (eval/eval.py, "
    "lwm_eval_utils, prompts/), read at run time, so figures are comparable with published "
    "ones. Implies --judge_style=official.")
_J_BASELINES = flags.DEFINE_bool("judge_baselines", True, "Judge the baselines too.")
_J_SYSTEMS = flags.DEFINE_list("judge_systems", None, "Only judge these systems.")
_DROP_EMPTY = flags.DEFINE_bool(
    "drop_empty", False, "Do not judge empty generations; mark them failed (excluded), as the "
    "official client does. By default they are judged like any other prediction.")
# files of the official client
_ROW_FORMAT = flags.DEFINE_enum("row_format", "auto", official.ROW_FORMATS,
                                "Shape of prediction/judged files: ours, the official client's, "
                                "or sniffed from the first row.")
_IMPORT_PREDS = flags.DEFINE_string(
    "import_predictions", None, "A predictions file (the official client's or ours) to copy in "
    "as --system's predictions before the step runs.")
_IMPORT_JUDGED = flags.DEFINE_string(
    "import_judged", None, "A judged file (the official client's or ours) to copy in as "
    "--system's judgements before the step runs.")


def _model_backend() -> Backend:
  if bool(_CHECKPOINT.value) == bool(_ENDPOINT.value):
    raise app.UsageError("infer needs exactly one of --checkpoint or --endpoint")
  if _CHECKPOINT.value:
    backend = SamplerBackend.from_checkpoint(
        _CHECKPOINT.value, temperature=_TEMPERATURE.value, max_new_tokens=_MAX_TOKENS.value,
        seed=_SEED.value, batch_size=_BATCH.value, decode_dtype=_DECODE_DTYPE.value or None)
  else:
    if not _MODEL.value:
      raise app.UsageError("--endpoint needs --model")
    backend = OpenAIBackend(_ENDPOINT.value, _MODEL.value, temperature=_TEMPERATURE.value,
                            max_tokens=_MAX_TOKENS.value, concurrency=_CONCURRENCY.value,
                            retries=_RETRIES.value, timeout_s=_TIMEOUT.value,
                            api_key=os.environ.get(_API_KEY_ENV.value), seed=_SEED.value)
  if _SYSTEM.value:
    backend.name = _SYSTEM.value
  try:
    A.check_system_name(backend.name)
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  return backend


def _judge_backend() -> Backend:
  if bool(_J_CHECKPOINT.value) == bool(_J_ENDPOINT.value):
    raise app.UsageError("judge needs exactly one of --judge_checkpoint or --judge_endpoint")
  temp = _J_TEMPERATURE.value
  if _J_CHECKPOINT.value:
    return SamplerBackend.from_checkpoint(
        _J_CHECKPOINT.value, temperature=max(temp, 0.0), max_new_tokens=_J_MAX_TOKENS.value,
        seed=_SEED.value, batch_size=_BATCH.value, decode_dtype=_DECODE_DTYPE.value or None)
  if not _J_MODEL.value:
    raise app.UsageError("--judge_endpoint needs --judge_model")
  return OpenAIBackend(_J_ENDPOINT.value, _J_MODEL.value, temperature=temp if temp >= 0 else None,
                       max_tokens=_J_MAX_TOKENS.value, concurrency=_J_CONCURRENCY.value,
                       retries=_RETRIES.value, timeout_s=_TIMEOUT.value,
                       api_key=os.environ.get(_J_API_KEY_ENV.value))


def infer(records, out: str) -> None:
  backend = _model_backend()  # refuses a reserved name before any file is touched
  paths = A.write_baselines(records, out)
  logging.info("baselines: %s", ", ".join(paths))
  stats = A.run_inference(records, backend, A.predictions_path(out, backend.name),
                          progress=_PROGRESS.value)
  print(f"infer {backend.name}: {stats.summary()}")


def judge(records, out: str) -> None:
  try:
    if _J_CLIENT.value:
      from lwm_jax.eval.official_client import (  # pylint: disable=import-outside-toplevel
          OfficialClientError, official_client_style)
      try:
        style = official_client_style(_J_CLIENT.value)
      except OfficialClientError as e:
        raise ValueError(str(e)) from None
    else:
      style = make_style(_J_STYLE.value, _J_PROMPTS.value, _J_CONTEXT.value)
  except (ValueError, FileNotFoundError) as e:
    raise app.UsageError(str(e)) from None
  from lwm_jax.eval.official_client import judge_protocol  # pylint: disable=import-outside-toplevel
  print(judge_protocol(_J_STYLE.value, _J_CLIENT.value, _DROP_EMPTY.value))
  backend = _judge_backend()
  systems = _J_SYSTEMS.value or A.list_systems(out, A.PRED_DIR)
  if not _J_BASELINES.value:
    systems = [s for s in systems if s not in A.BASELINES]
  if not systems:
    raise app.UsageError(f"no predictions under {out}/{A.PRED_DIR}: run infer first")
  for name in systems:
    preds = A.load_predictions(A.predictions_path(out, name), _ROW_FORMAT.value)
    stats, skipped = run_judging(records, preds, backend, A.judged_path(out, name),
                                 retries=_J_RETRIES.value, style=style,
                                 drop_empty=_DROP_EMPTY.value, progress=_PROGRESS.value,
                                 desc=f"judge {name}")
    print(f"judge {name}: {stats.summary()}; skipped {skipped}")


def score(records, out: str) -> None:
  results = report.score_run(records, out, _ROW_FORMAT.value)
  paths = report.write_report(results, out)
  print(report.markdown_report(results))
  print("wrote " + ", ".join(paths.values()))


def export(records, out: str) -> None:
  """Every system's files in the official client's shapes, under OUT/official/."""
  systems = A.list_systems(out, A.PRED_DIR)
  if not systems:
    raise app.UsageError(f"no predictions under {out}/{A.PRED_DIR}: run infer first")
  for name in systems:
    preds = A.load_predictions(A.predictions_path(out, name), _ROW_FORMAT.value)
    jpath = A.judged_path(out, name)
    judged = A.load_judged(jpath, _ROW_FORMAT.value) if os.path.exists(jpath) else None
    prefix = os.path.join(out, "official", A.system_slug(name))
    counts = official.export_system(records, preds, judged, prefix)
    print(f"export {name}: {counts} -> {prefix}_*.jsonl")


def import_file(src: str, dest: str, kind: str) -> None:
  """Copies a user's file into the run (never over a different file) after checking it reads."""
  A.check_system_name(_SYSTEM.value)
  if not os.path.isfile(src):
    raise app.UsageError(f"--import_{kind}: no such file {src}")
  load = A.load_predictions if kind == "predictions" else A.load_judged
  n = len(load(src, _ROW_FORMAT.value))  # a clear error naming file and line if unreadable
  if os.path.exists(dest):
    if filecmp.cmp(src, dest, shallow=False):
      return
    raise app.UsageError(f"--import_{kind}: {dest} exists and differs from {src}; "
                         "choose another --system or --out")
  os.makedirs(os.path.dirname(dest), exist_ok=True)
  shutil.copyfile(src, dest)
  print(f"imported {n} {kind} rows from {src} as {_SYSTEM.value}")


def main(argv: list[str]) -> None:
  try:
    run(argv)
  except ValueError as e:  # bad files and names: one clear line (file:line where known)
    sys.exit(f"error: {e}")


def run(argv: list[str]) -> None:
  if len(argv) != 2 or argv[1] not in STEPS:
    raise app.UsageError(f"usage: {argv[0]} {{{'|'.join(STEPS)}}} --data=... --out=...")
  if not _DATA.value or not _OUT.value:
    raise app.UsageError("--data and --out are required")
  step = argv[1]
  logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
  records = R.load_bench(_DATA.value, domains=_DOMAINS.value, limit_per_domain=_LIMIT.value)
  logging.info("%d records from %s", len(records), _DATA.value)
  os.makedirs(_OUT.value, exist_ok=True)
  for src, kind, where in ((_IMPORT_PREDS.value, "predictions", A.predictions_path),
                           (_IMPORT_JUDGED.value, "judged", A.judged_path)):
    if src:
      if not _SYSTEM.value:
        raise app.UsageError(f"--import_{kind} needs --system (the name to report it under)")
      import_file(src, where(_OUT.value, _SYSTEM.value), kind)
  if step == "export":
    export(records, _OUT.value)
    return
  if step in ("infer", "all"):
    infer(records, _OUT.value)
  if step in ("judge", "all") and (step == "judge" or _J_ENDPOINT.value or _J_CHECKPOINT.value):
    judge(records, _OUT.value)
  if step in ("score", "all"):
    score(records, _OUT.value)
