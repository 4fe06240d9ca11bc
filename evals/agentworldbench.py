"""AgentWorldBench evaluation: `infer`, `judge`, `score` (or `all`), each resumable.

This is the command line; `evals/` also holds the bundled mini benchmark (`evals/mini_bench/`).
The library it drives is `lwm_jax/eval/` (inference, judge, scoring, reports) and the record
format is `lwm_jax/data/bench_records.py`.

  # a hosted or served model (any OpenAI-compatible endpoint), judged by another endpoint
  python evals/agentworldbench.py infer --data=AgentWorldBench/ --out=runs/awb \
      --endpoint=http://localhost:8000/v1 --model=Qwen/Qwen-AgentWorld-35B-A3B
  python evals/agentworldbench.py judge --data=AgentWorldBench/ --out=runs/awb \
      --judge_endpoint=https://api.example.com/v1 --judge_model=some-judge
  python evals/agentworldbench.py score --data=AgentWorldBench/ --out=runs/awb

  # our own checkpoint through lwm_jax.sampling.Sampler
  python evals/agentworldbench.py all --data=evals/mini_bench --out=runs/mini --checkpoint=ckpt/

`--data` is a `{domain}_test.jsonl` file or a directory of them. `infer` also writes the baselines
(copy-previous-observation, empty); `judge` judges every system found under `--out` (baselines
included unless --nojudge_baselines); `score` writes scores.md, scores.json and scores_*.png.
API keys come from the environment variables named by --api_key_env / --judge_api_key_env.
"""
from __future__ import annotations

import logging
import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lwm_jax.eval import inference as A  # noqa: E402
from lwm_jax.eval import records as R  # noqa: E402
from lwm_jax.eval import report  # noqa: E402
from lwm_jax.eval.backends import Backend, OpenAIBackend, SamplerBackend  # noqa: E402
from lwm_jax.eval.judge import run_judging  # noqa: E402

STEPS = ("infer", "judge", "score", "all")

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
_J_BASELINES = flags.DEFINE_bool("judge_baselines", True, "Judge the baselines too.")
_J_SYSTEMS = flags.DEFINE_list("judge_systems", None, "Only judge these systems.")


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
  paths = A.write_baselines(records, out)
  logging.info("baselines: %s", ", ".join(paths))
  backend = _model_backend()
  stats = A.run_inference(records, backend, A.predictions_path(out, backend.name),
                          progress=_PROGRESS.value)
  print(f"infer {backend.name}: {stats.summary()}")


def judge(records, out: str) -> None:
  backend = _judge_backend()
  systems = _J_SYSTEMS.value or A.list_systems(out, A.PRED_DIR)
  if not _J_BASELINES.value:
    systems = [s for s in systems if s not in A.BASELINES]
  if not systems:
    raise app.UsageError(f"no predictions under {out}/{A.PRED_DIR}: run infer first")
  for name in systems:
    preds = A.load_rows(A.predictions_path(out, name))
    stats, skipped = run_judging(records, preds, backend, A.judged_path(out, name),
                                 retries=_J_RETRIES.value, max_context_chars=_J_CONTEXT.value,
                                 progress=_PROGRESS.value, desc=f"judge {name}")
    print(f"judge {name}: {stats.summary()}; skipped {skipped}")


def score(records, out: str) -> None:
  results = report.score_run(records, out)
  paths = report.write_report(results, out)
  print(report.markdown_report(results))
  print("wrote " + ", ".join(paths.values()))


def main(argv: list[str]) -> None:
  if len(argv) != 2 or argv[1] not in STEPS:
    raise app.UsageError(f"usage: {argv[0]} {{{'|'.join(STEPS)}}} --data=... --out=...")
  if not _DATA.value or not _OUT.value:
    raise app.UsageError("--data and --out are required")
  step = argv[1]
  logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request otherwise
  records = R.load_bench(_DATA.value, domains=_DOMAINS.value, limit_per_domain=_LIMIT.value)
  logging.info("%d records from %s", len(records), _DATA.value)
  os.makedirs(_OUT.value, exist_ok=True)
  if step in ("infer", "all"):
    infer(records, _OUT.value)
  if step in ("judge", "all") and (step == "judge" or _J_ENDPOINT.value or _J_CHECKPOINT.value):
    judge(records, _OUT.value)
  if step in ("score", "all"):
    score(records, _OUT.value)


if __name__ == "__main__":
  app.run(main)
