"""The one trainer loop for CPT, SFT and (synthetic-rollout) GSPO.

`train(config, workdir)`: validate the config -> check the workdir -> (multi-host init) -> mesh ->
state (fresh, from a Hugging Face checkpoint, or resumed from the latest Orbax checkpoint together
with the data iterator) -> compiled step -> loop with metrics, validation, checkpoints and a SIGTERM
save -> final save, loss plot, optional HF export. Returns a summary dict.
"""
from __future__ import annotations

import json
import logging
import math
import os
import signal
import time
from typing import Any, Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from lwm_jax import sharding as shd
from lwm_jax.model.config import ModelConfig
from lwm_jax.train import checkpoint as ckpt_lib
from lwm_jax.train import metrics as metrics_lib
from lwm_jax.train import optimizer as opt_lib
from lwm_jax.train import state as state_lib
from lwm_jax.train import steps as steps_lib
from lwm_jax.train.synthetic import SyntheticIterator

STAGES = ("cpt", "sft", "rl")


class TrainingDiverged(RuntimeError):
  """The loss became NaN or infinite."""


# ----------------------------------------------------------------------- validation
def validate_config(c: ml_collections.ConfigDict) -> ModelConfig:
  """Checks the config before anything is compiled; errors name the field. Returns the model config."""
  def need(cond: bool, field: str, why: str):
    if not cond:
      raise ValueError(f"config.{field}: {why}")
  need(c.stage in STAGES, "stage", f"'{c.stage}' is not one of {STAGES}")
  try:
    model = ModelConfig.from_dict(c.model.to_dict()).validate()
  except (TypeError, ValueError) as e:
    raise ValueError(f"config.{e}" if str(e).startswith("model.") else f"config.model: {e}") from e
  t, o = c.train, c.optim
  for f in ("num_steps", "batch_size", "seq_len", "micro_batches"):
    need(int(t[f]) > 0, f"train.{f}", f"must be positive, got {t[f]}")
  need(t.batch_size % t.micro_batches == 0, "train.micro_batches",
       f"{t.micro_batches} does not divide train.batch_size={t.batch_size}")
  need(t.seq_len <= model.max_position_embeddings, "train.seq_len",
       f"{t.seq_len} exceeds model.max_position_embeddings={model.max_position_embeddings}")
  need(t.precision in ("auto", "float32", "bfloat16"), "train.precision",
       f"'{t.precision}' is not auto, float32 or bfloat16")
  need(o.lr > 0, "optim.lr", f"must be positive, got {o.lr}")
  need(o.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
  need(0 <= o.b1 < 1 and 0 <= o.b2 < 1, "optim.b1", "b1 and b2 must lie in [0, 1)")
  need(o.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
  for ax in ("data", "fsdp", "expert", "tensor"):
    need(c.mesh[ax] == -1 or c.mesh[ax] >= 1, f"mesh.{ax}", f"must be >= 1 or -1, got {c.mesh[ax]}")
  if c.mesh.expert > 1:
    need(model.num_experts % c.mesh.expert == 0, "mesh.expert",
         f"{c.mesh.expert} does not divide model.num_experts={model.num_experts}")
  need(c.data.source in ("synthetic", "pipeline"), "data.source",
       f"'{c.data.source}' is not synthetic or pipeline")
  if c.data.source == "pipeline":
    need(c.stage != "rl", "data.source", "the rl stage trains on synthetic rollouts here")
    need(bool(c.data.tokenizer), "data.tokenizer", "a tokenizer path is required for the pipeline")
    need(os.path.exists(c.data.tokenizer), "data.tokenizer", f"{c.data.tokenizer} does not exist")
    need(bool(c.data.pipeline.jsonl or c.data.pipeline.tfds_dir), "data.pipeline.jsonl",
         "set data.pipeline.jsonl or data.pipeline.tfds_dir")
  if c.stage == "rl":
    need(c.rl.algo in ("gspo", "gspo_token", "grpo"), "rl.algo",
         f"'{c.rl.algo}' is not gspo, gspo_token or grpo")
    need(0 < c.rl.eps_low < 1 and c.rl.eps_high > 0, "rl.eps_low", "clip bounds out of range")
    need(c.rl.group_size >= 2 and t.batch_size % c.rl.group_size == 0, "rl.group_size",
         f"{c.rl.group_size} must be >= 2 and divide train.batch_size={t.batch_size}")
    need(0 < c.rl.response_len < t.seq_len, "rl.response_len", "must be in (0, train.seq_len)")
  need(c.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1")
  if c.init_from_hf:
    need(os.path.isdir(c.init_from_hf), "init_from_hf", f"{c.init_from_hf} is not a directory")
  return model


def check_workdir(workdir: str) -> str:
  """Creates the workdir and proves it writable, or fails naming it."""
  workdir = os.path.abspath(workdir)
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_test_{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise PermissionError(f"workdir {workdir} is not writable: {e}") from e
  return workdir


# ----------------------------------------------------------------------- data
def _make_iterators(c, model_cfg: ModelConfig, stage: str):
  """(train iterator, eval-batch factory or None, tokenizer path)."""
  pc, pi = jax.process_count(), jax.process_index()
  t = c.train
  if c.data.source == "synthetic":
    it = SyntheticIterator(t.batch_size, t.seq_len, model_cfg.vocab_size, c.seed, pi, pc)
    def evals():
      return SyntheticIterator(t.batch_size, t.seq_len, model_cfg.vocab_size, c.seed + 10_000, pi,
                               pc)
    return it, evals, ""
  from lwm_jax.data import pipeline, tokenizer as tok_lib  # pylint: disable=import-outside-toplevel
  tok = tok_lib.load_tokenizer(c.data.tokenizer)
  if tok.vocab_size > model_cfg.vocab_size:
    raise ValueError(f"config.model.vocab_size: {model_cfg.vocab_size} is smaller than the "
                     f"tokenizer's {tok.vocab_size} ({c.data.tokenizer})")
  if t.batch_size % pc:
    raise ValueError(f"config.train.batch_size: {t.batch_size} is not divisible by {pc} processes")
  dcfg = ml_collections.ConfigDict(c.data.pipeline.to_dict())
  dcfg.seq_len, dcfg.batch_size = t.seq_len, t.batch_size // pc
  dcfg.seed = c.seed if not dcfg.seed else dcfg.seed
  it = pipeline.make_train_iterator(dcfg, tok, stage, pi, pc)
  evals = None
  if c.data.eval_jsonl:
    ecfg = ml_collections.ConfigDict(dcfg.to_dict())
    ecfg.jsonl, ecfg.tfds_dir, ecfg.shuffle, ecfg.num_epochs = c.data.eval_jsonl, "", False, -1
    def evals():
      return pipeline.make_train_iterator(ecfg, tok, stage, pi, pc)
  return it, evals, os.path.abspath(c.data.tokenizer)


def _rl_batch(rng: np.random.Generator, batch: int, seq_len: int, resp_len: int, vocab: int,
              group: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
  """Synthetic rollouts: G random responses per random prompt; reward = share of response tokens
  below vocab/4 (a task the policy can learn by shifting mass to low token ids)."""
  n_prompts = batch // group
  prompt_len = seq_len - resp_len
  prompts = rng.integers(0, vocab, (n_prompts, prompt_len))
  tokens = np.concatenate([np.repeat(prompts, group, 0),
                           rng.integers(0, vocab, (batch, resp_len))], axis=1).astype(np.int32)
  mask = np.zeros((batch, seq_len), np.float32)
  mask[:, prompt_len:] = 1
  rewards = (tokens[:, prompt_len:] < vocab // 4).mean(axis=1)
  b = {"tokens": tokens, "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32),
                                                      (batch, seq_len)).copy(),
       "segment_ids": np.ones((batch, seq_len), np.int32), "response_mask": mask}
  return b, rewards


# ----------------------------------------------------------------------- the loop
def train(config: ml_collections.ConfigDict, workdir: str, train_iter: Any = None,
          eval_iter_factory: Any = None) -> dict[str, Any]:
  """Runs (or resumes) training. `train_iter` / `eval_iter_factory` replace the configured data
  (an iterator of this process's batches with get_state/set_state, and a callable returning a fresh
  validation iterator)."""
  c = config
  model_cfg = validate_config(c)
  workdir = check_workdir(workdir)
  if c.dist.coordinator_address or c.dist.auto:
    shd.initialize_distributed(c.dist.coordinator_address or None,
                               c.dist.num_processes if c.dist.coordinator_address else None,
                               c.dist.process_id if c.dist.coordinator_address else None,
                               c.dist.timeout_s, c.dist.cpu_collectives or None)
  primary = jax.process_index() == 0
  model_cfg = opt_lib.apply_precision(model_cfg, c.train.precision)
  mesh = shd.make_mesh(**c.mesh.to_dict())
  t = c.train
  dp = int(np.prod([mesh.shape[a] for a in shd.BATCH_AXES]))
  if (t.batch_size // t.micro_batches) % dp and dp > 1:
    logging.warning("train.batch_size/micro_batches=%d is not divisible by the %d data-parallel "
                    "devices: the batch is replicated", t.batch_size // t.micro_batches, dp)

  hf_params = None
  if c.init_from_hf:
    from lwm_jax import hf  # pylint: disable=import-outside-toplevel
    from flax import nnx  # pylint: disable=import-outside-toplevel
    hf_model = hf.load_pretrained(c.init_from_hf, dtype="float32",
                                  **{k: v for k, v in model_cfg.to_dict().items()
                                     if k in ("moe_backend", "capacity_factor", "remat",
                                              "ep_capacity_factor")})
    loaded = hf_model.cfg
    model_cfg = loaded.replace(dtype=model_cfg.dtype, param_dtype="float32")
    hf_params = nnx.state(hf_model)
  # model / tokenizer / config.json
  train_it, eval_factory, tok_path = _make_iterators(c, model_cfg, "cpt" if c.stage == "rl"
                                                     else c.stage)
  train_it = train_iter if train_iter is not None else train_it
  eval_factory = eval_iter_factory if eval_iter_factory is not None else eval_factory
  resolved = c.to_dict()
  resolved["model"] = model_cfg.to_dict()
  resolved["workdir"] = workdir
  resolved["process_count"] = jax.process_count()
  if primary:
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump(resolved, f, indent=2, default=str)

  tx, schedule = opt_lib.make_optimizer(c.optim, t.num_steps)
  graphdef, state, shardings = state_lib.create_train_state(model_cfg, tx, mesh, c.seed,
                                                            params=hf_params)
  del hf_params

  ckpt = ckpt_lib.Checkpointer(workdir, c.checkpoint.every, c.checkpoint.keep,
                               c.checkpoint.use_async)
  start = 0
  if c.checkpoint.resume and ckpt.latest_step() is not None:
    restored = ckpt.restore(state)
    state, it_state, meta = restored
    state = jax.device_put(state, shardings)
    train_it.set_state(it_state)
    start = int(state.step)
    logging.info("resumed from %s/%d", ckpt.dir, start)

  scfg = steps_lib.StepConfig(
      micro_batches=t.micro_batches,
      aux_loss_coef=(t.aux_loss_coef if t.aux_loss_coef >= 0 else model_cfg.router_aux_loss_coef),
      router_z_loss_coef=model_cfg.router_z_loss_coef, z_loss_coef=t.z_loss_coef,
      algo=c.rl.algo, eps_low=c.rl.eps_low, eps_high=c.rl.eps_high,
      log_ratio_cap=c.rl.log_ratio_cap or None, kl_coef=c.rl.kl_coef)
  shapes2 = (t.batch_size, t.seq_len)
  if c.stage == "rl":
    keys = dict.fromkeys(("tokens", "positions", "segment_ids", "response_mask", "old_logprobs"),
                         shapes2)
    step_fn = steps_lib.compile_gspo_step(graphdef, tx, schedule, scfg, mesh, shardings,
                                          dict(keys, advantages=(t.batch_size,)))
    logp_fn = steps_lib.compile_logprobs(graphdef, mesh, shardings, {
        k: shapes2 for k in ("tokens", "positions", "segment_ids")})
  else:
    keys = dict.fromkeys(steps_lib.XENT_KEYS, shapes2)
    step_fn = steps_lib.compile_xent_step(graphdef, tx, schedule, scfg, mesh, shardings, keys)
  eval_fn = (steps_lib.compile_eval(graphdef, mesh, shardings,
                                    dict.fromkeys(steps_lib.XENT_KEYS, shapes2))
             if eval_factory is not None and t.eval_every > 0 and c.stage != "rl" else None)

  fpt = metrics_lib.flops_per_token(model_cfg, t.seq_len)
  peak, peak_src = metrics_lib.peak_flops_per_device(measure_cpu=t.log_every > 0)
  peak_total = peak * jax.device_count()
  writer = metrics_lib.MetricsWriter(workdir, enabled=primary)
  meta = {"model": model_cfg.to_dict(), "tokenizer": tok_path, "stage": c.stage}

  stop = {"signal": None}
  def on_sigterm(signum, _frame):
    stop["signal"] = signum
  old_handler = signal.signal(signal.SIGTERM, on_sigterm) if _main_thread() else None

  bar = None
  if primary and t.progress:
    from tqdm import tqdm  # pylint: disable=import-outside-toplevel
    bar = tqdm(total=t.num_steps, initial=start, desc=f"{c.stage}", dynamic_ncols=True)
  end_step = t.num_steps if not t.stop_after else min(t.num_steps, t.stop_after)
  losses_seen, last_good, step, warned_empty = [], None, start, False
  window_t, window_tokens = time.perf_counter(), 0
  summary: dict[str, Any] = {"workdir": workdir, "start_step": start, "peak_flops": peak,
                             "peak_source": peak_src, "flops_per_token": fpt}
  try:
    while step < end_step:
      if c.stage == "rl":
        b, rewards = _rl_batch(np.random.default_rng([c.seed, step, jax.process_index()]),
                               t.batch_size // jax.process_count(), t.seq_len, c.rl.response_len,
                               model_cfg.vocab_size, c.rl.group_size)
        old = logp_fn(state, {k: b[k] for k in ("tokens", "positions", "segment_ids")})
        b["old_logprobs"] = old
        b["advantages"] = np.asarray(
            _advantages(rewards, c.rl.group_size), np.float32)
        state, m = step_fn(state, b)
        n_tokens = t.batch_size * t.seq_len
      else:
        b = next(train_it)
        state, m = step_fn(state, b)
        n_tokens = t.batch_size * t.seq_len
      step += 1
      loss = float(m["loss"])
      if not math.isfinite(loss):
        ckpt.wait()
        raise TrainingDiverged(
            f"loss is {loss} at step {step}; stopping. The last good checkpoint is "
            f"{ckpt.dir}/{ckpt.last_good_step()}" if ckpt.last_good_step() is not None else
            f"loss is {loss} at step {step}; stopping (no checkpoint was saved yet).")
      losses_seen.append(loss)
      if c.stage != "rl" and not warned_empty and float(m["loss_weight"]) == 0:
        warned_empty = True
        logging.warning("step %d: the batch has no token with loss weight > 0 (loss reads 0); "
                        "is train.seq_len (%d) long enough for the data?", step, t.seq_len)
      last_good = step
      window_tokens += n_tokens
      if bar is not None:
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.4f}")
      if t.log_every and (step % t.log_every == 0 or step == end_step):
        dt = time.perf_counter() - window_t
        tps = window_tokens / max(dt, 1e-9)
        scal = {k: v for k, v in jax.device_get(m).items()}
        scal.update(tokens_per_s=tps, mfu=tps * fpt / peak_total if peak_total > 0 else float("nan"))
        writer.write(step, scal)
        window_t, window_tokens = time.perf_counter(), 0
        summary["tokens_per_s"], summary["mfu"] = tps, scal["mfu"]
      if eval_fn is not None and (step % t.eval_every == 0 or step == end_step):
        ev = evaluate(eval_fn, state, eval_factory(), t.eval_batches)
        writer.write(step, ev, prefix="eval")
        summary["eval"] = ev
      ckpt.save(step, state, train_it.get_state(), dict(meta, step=step, loss=loss))
      if stop["signal"] is not None:
        logging.warning("signal %s: saving step %d and stopping", stop["signal"], step)
        break
    ckpt.save(step, state, train_it.get_state(), dict(meta, step=step,
                                                      loss=losses_seen[-1] if losses_seen else None),
              force=True)
    ckpt.wait()
  finally:
    if bar is not None:
      bar.close()
    writer.close()
    ckpt.close()
    if old_handler is not None:
      signal.signal(signal.SIGTERM, old_handler)
  if primary:
    summary["loss_png"] = metrics_lib.plot_losses(workdir)
  if c.export_hf:
    from lwm_jax import hf  # pylint: disable=import-outside-toplevel
    from flax import nnx  # pylint: disable=import-outside-toplevel
    out = c.export_hf_dir or os.path.join(workdir, "hf")
    hf.save_pretrained(nnx.merge(graphdef, jax.device_get(state.params)), out,
                       tokenizer=tok_path or None, generation=c.init_from_hf or None)
    summary["export_hf"] = out
  summary.update(losses=losses_seen, final_step=step, last_good_step=last_good,
                 stopped_by_signal=stop["signal"] is not None)
  return summary


def _advantages(rewards: np.ndarray, group: int) -> np.ndarray:
  from lwm_jax.train.losses import group_advantages  # pylint: disable=import-outside-toplevel
  return np.asarray(group_advantages(jnp.asarray(rewards), group))


def evaluate(eval_fn, state, it: Iterator, n_batches: int) -> dict[str, float]:
  """Weighted validation loss and token accuracy over `n_batches` batches."""
  tot = {"nll": 0.0, "weight": 0.0, "correct": 0.0}
  for _ in range(n_batches):
    try:
      b = next(it)
    except StopIteration:
      break
    s = jax.device_get(eval_fn(state, b))
    for k in tot:
      tot[k] += float(s[k])
  w = max(tot["weight"], 1e-8)
  return {"loss": tot["nll"] / w, "accuracy": tot["correct"] / w, "kept_tokens": tot["weight"]}


def _main_thread() -> bool:
  import threading  # pylint: disable=import-outside-toplevel
  return threading.current_thread() is threading.main_thread()
