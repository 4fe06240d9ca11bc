"""The RL stage from a training config: the rollout source the trainer loops over.

`rollout_source(config)` reads the trajectories of `config.data.pipeline.jsonl`, keeps the RL
share of the deterministic CPT/SFT/RL split (`config.rl.pool_fractions`, by trajectory id),
builds the prompt pool (over-long prompts dropped and counted), the reward mix
(`config.rl.reward`, e.g. "rule=0.1,rubric=0.9"; the rubric's judge from `config.rl.judge_*`)
and, when `config.rl.eval_jsonl` names held-out trajectories, the periodic held-out evaluation
(`lwm_jax.rl.heldout`). The trainer is handed the source (`trainer.train(config, workdir,
source=...)`; launch/train.py does this for `data.source="rollouts"`) and calls `bind`,
`next_batch`, `evaluate` on it. See docs/recipe.md (stage 3).
"""
from __future__ import annotations

import glob
import logging
import os
from typing import Any

import ml_collections

from lwm_jax.data import schema
from lwm_jax.data import tokenizer as tok_lib
from lwm_jax.rl import pool as pool_lib
from lwm_jax.rl import replay  # noqa: F401  (registers the 'replay' reward)
from lwm_jax.rl import rewards as rewards_lib
from lwm_jax.rl.heldout import HeldOut
from lwm_jax.rl.rollout import RolloutConfig, RolloutSource


def parse_fractions(spec: str) -> dict[str, float]:
  """'cpt=0.6,sft=0.3,rl=0.1' -> {'cpt': 0.6, 'sft': 0.3, 'rl': 0.1} (checked)."""
  out: dict[str, float] = {}
  for part in str(spec).split(","):
    if not part.strip():
      continue
    name, sep, value = part.partition("=")
    try:
      if not sep:
        raise ValueError
      out[name.strip()] = float(value)
    except ValueError:
      raise ValueError(f"config.rl.pool_fractions: '{part}' is not POOL=FRACTION") from None
  try:
    return pool_lib.check_fractions(out)
  except ValueError as e:
    raise ValueError(f"config.rl.pool_fractions: {e}") from None


def expand_paths(spec: str, field: str) -> list[str]:
  """Comma-separated files, globs or folders (every *.jsonl / *.jsonl.gz inside)."""
  files: list[str] = []
  for part in [p.strip() for p in str(spec).split(",") if p.strip()]:
    if os.path.isdir(part):
      found = sorted(glob.glob(os.path.join(part, "*.jsonl")) +
                     glob.glob(os.path.join(part, "*.jsonl.gz")))
    else:
      found = sorted(glob.glob(part))
    if not found:
      raise ValueError(f"config.{field}: no trajectory file matches '{part}'")
    files += found
  if not files:
    raise ValueError(f"config.{field}: no trajectory files given")
  return files


def read_trajectories(spec: str, field: str) -> list[schema.Trajectory]:
  return [t for p in expand_paths(spec, field) for t in schema.read_jsonl(p)]


def rollout_config(c: ml_collections.ConfigDict, process_count: int | None = None
                   ) -> RolloutConfig:
  """The rollout settings of `config.rl`, checked against `config.train`'s batch shape when the
  number of processes is given (the trainer checks it again at `bind`)."""
  r, t = c.rl, c.train
  rc = RolloutConfig(
      prompts_per_batch=r.prompts_per_batch, group_size=r.group_size, seq_len=t.seq_len,
      max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
      seed=c.seed, shuffle=True, filter_zero_variance=r.filter_zero_variance,
      updates_per_batch=r.updates_per_batch).validate()
  if process_count is not None:
    rc.check_run(t.batch_size, processes=process_count)
  return rc


def make_reward(c: ml_collections.ConfigDict) -> rewards_lib.MixedReward:
  """The configured mix; a rubric term gets its judge backend from `rl.judge_endpoint` (an
  OpenAI-compatible server) or `rl.judge_checkpoint` (a local checkpoint through our Sampler),
  and `rl.judge_tries` calls per reply before its reward is invalid."""
  r = c.rl
  weights = rewards_lib.parse_weights(r.reward)
  opts: dict[str, Any] = {"similarity": r.similarity, "flagged": r.flagged}
  if weights.get("rubric"):
    opts["backend"] = judge_backend(c)
    opts["tries"] = int(r.get("judge_tries", 3))
  return rewards_lib.make_reward(weights, **opts)


def judge_backend(c: ml_collections.ConfigDict):
  """The RL judge: greedy, with `rl.judge_max_tokens` new tokens (room for a reasoning judge's
  thinking), `rl.judge_thinking` as the chat template's `enable_thinking`, and
  `rl.judge_timeout_s` per request. A reply cut off by the budget is counted apart
  (`judge_truncated`)."""
  from lwm_jax.sampling import backends  # pylint: disable=import-outside-toplevel
  r = c.rl
  max_tokens = int(r.get("judge_max_tokens", 16384))
  thinking = bool(r.get("judge_thinking", True))
  if max_tokens < 1:
    raise ValueError(f"config.rl.judge_max_tokens: must be >= 1, got {max_tokens}")
  if r.judge_endpoint:
    return backends.OpenAIBackend(
        r.judge_endpoint, r.judge_model or "judge", temperature=0.0, max_tokens=max_tokens,
        timeout_s=float(r.get("judge_timeout_s", 900.0)),
        concurrency=int(r.get("judge_concurrency", 8)),
        extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
  if r.judge_checkpoint:
    return backends.SamplerBackend.from_checkpoint(r.judge_checkpoint, temperature=0.0,
                                                   max_new_tokens=max_tokens)
  raise ValueError("config.rl.reward has a 'rubric' term: set config.rl.judge_endpoint (an "
                   "OpenAI-compatible server) or config.rl.judge_checkpoint, or use "
                   "'rule' / 'reference' for a run without a judge")


def policy_tokenizer(c: ml_collections.ConfigDict, why: str) -> Any:
  """The policy's tokenizer, `config.data.tokenizer`; `why` says in the error what needs it."""
  if not c.data.tokenizer or not os.path.exists(c.data.tokenizer):
    raise ValueError(f"config.data.tokenizer: '{c.data.tokenizer}' does not exist ({why})")
  return tok_lib.load_tokenizer(c.data.tokenizer)


def engine_options(c: ml_collections.ConfigDict) -> dict[str, Any]:
  e = c.rl.engine.to_dict() if "engine" in c.rl else {}
  return {k: v for k, v in e.items() if v}


def rollout_source(c: ml_collections.ConfigDict) -> RolloutSource:
  """The RL stage's batch source for config `c` (see the module docstring). The process layout
  comes from the trainer (`bind`), which also checks the batch shape against it."""
  tok = policy_tokenizer(c, "the RL stage renders its prompts with the policy's tokenizer")
  rc = rollout_config(c)
  trajs = read_trajectories(c.data.pipeline.jsonl, "data.pipeline.jsonl")
  share = pool_lib.split_pools(trajs, parse_fractions(c.rl.pool_fractions), c.rl.pool_seed)["rl"]
  pool = pool_lib.build_pool(share, tok, rc.max_prompt_tokens, seed=c.seed)
  logging.warning("%s (the rl share %s of %d trajectories)", pool.summary(), c.rl.pool_fractions,
                  len(trajs))
  heldout = None
  if c.rl.eval_jsonl:
    held = read_trajectories(c.rl.eval_jsonl, "rl.eval_jsonl")
    hp = pool_lib.build_pool(held, tok, rc.max_prompt_tokens, seed=c.seed)
    heldout = HeldOut(hp, limit=c.rl.eval_prompts, max_new_tokens=c.rl.eval_max_new_tokens
                      or rc.max_new_tokens)
    logging.warning("held-out evaluation: %d of %d prompts of %s", len(heldout.items), len(hp),
                    c.rl.eval_jsonl)
  return RolloutSource(None, tok, pool, make_reward(c), rc, heldout=heldout,
                       kl=c.rl.kl_coef > 0, **engine_options(c))
