"""The one trainer loop: a batch source and a compiled step, for CPT, SFT and GSPO alike.

`train(config, workdir)`: check the config and workdir -> (multi-host init) -> mesh -> state (fresh,
from a Hugging Face checkpoint, or resumed from the latest Orbax checkpoint together with the
source's state) -> the stage's compiled step -> loop: next batch, step, metrics, validation,
checkpoint -> final save, loss plot, optional HF export. Returns a summary dict.

Stages differ only in their step (`STEP_KINDS`, chosen by the stage's record in
lwm_jax/stages.py) and their batch source (lwm_jax/train/sources.py):
the Grain pipeline or a drill mixture for CPT/SFT, rollouts for RL (toy ones in lwm_jax/train/synthetic.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import signal
import threading
import time
from typing import Any, Callable, Iterator

import jax
import ml_collections
import numpy as np

from lwm_jax import sharding as shd
from lwm_jax.train import checkpoint as ckpt_lib
from lwm_jax.train import losses as losses_lib
from lwm_jax.train import metrics as metrics_lib
from lwm_jax.train import optimizer as opt_lib
from lwm_jax.train import sources as sources_lib
from lwm_jax.train import state as state_lib
from lwm_jax.train import steps as steps_lib
from lwm_jax.train import synthetic
from lwm_jax.stages import get_stage
from lwm_jax.train.run_config import (check_workdir, save_run_config, sharding_rules,  # noqa: F401
                                      validate_config)


class TrainingDiverged(RuntimeError):
  """The loss became NaN or infinite."""


class EmptyBatchError(ValueError):
  """A batch had no token with loss weight: there was nothing to train on."""


@dataclasses.dataclass(frozen=True)
class StepKind:
  """How a stage trains: its compiled step, its batch entries ([B, S] unless in `per_row`, [B])
  and the metric that counts the tokens it learns from."""
  compile: Callable[..., steps_lib.CompiledStep]
  keys: tuple[str, ...]
  per_row: tuple[str, ...]
  target_metric: str
  evaluates: bool              # validation batches (next-token loss) make sense
  # a batch with no weighted token is allowed (RL: every group of the mini-batch had equal
  # rewards and was filtered; its update is a no-op apart from the optimizer's momentum)
  empty_ok: bool = False

  def shapes(self, batch: int, seq_len: int) -> dict[str, tuple[int, ...]]:
    return {k: (batch,) if k in self.per_row else (batch, seq_len) for k in self.keys}


XENT = StepKind(steps_lib.compile_xent_step, steps_lib.XENT_KEYS, (), "loss_weight", True)
POLICY = StepKind(steps_lib.compile_gspo_step, steps_lib.RL_KEYS, ("advantages",),
                  "response_tokens", False, empty_ok=True)
STEP_KINDS = {"xent": XENT, "policy": POLICY}  # a stage's `step` (lwm_jax/stages.py) -> its kind


def step_kind(stage: str) -> StepKind:
  """The step a stage trains with (its registered record's `step`)."""
  return STEP_KINDS[get_stage(stage).step]


def run_step_kind(c: ml_collections.ConfigDict) -> StepKind:
  """The step of config `c`'s stage with the batch layout the run's source gives: reference
  log-probs when a KL-capable stage sets `rl.kl_coef > 0`; advantages per token with agent RL's
  per-turn credit."""
  stage = get_stage(c.stage)
  kind = STEP_KINDS[stage.step]
  if stage.kl_reference and c.rl.kl_coef > 0:
    kind = dataclasses.replace(kind, keys=kind.keys + ("ref_logprobs",))
  if token_advantages(c):  # agent RL with per-turn credit: advantages per token, [B, S]
    kind = dataclasses.replace(kind, per_row=())
  return kind


# ----------------------------------------------------------------------- the loop
def train(config: ml_collections.ConfigDict, workdir: str, source: Any = None,
          eval_source: Callable[[], Iterator] | None = None, *, train_iter: Any = None,
          eval_iter_factory: Callable[[], Iterator] | None = None) -> dict[str, Any]:
  """Runs (or resumes) training. `source` replaces the configured data: a batch source
  (sources.BatchSource) or any iterator of this process's batches with get_state/set_state;
  `eval_source` returns a fresh iterator of validation batches. (`train_iter` and
  `eval_iter_factory` are their older names.)"""
  c, t = config, config.train
  model_cfg = validate_config(c)
  workdir = check_workdir(workdir)
  _init_distributed(c.dist)
  primary = jax.process_index() == 0
  mesh = shd.make_mesh(**c.mesh.to_dict())
  _warn_if_replicated(c, mesh)
  model_cfg, hf_params = _model_and_init(c, opt_lib.apply_precision(model_cfg, t.precision))
  source, eval_source, tok_path = _sources(
      c, model_cfg, source if source is not None else train_iter,
      eval_source if eval_source is not None else eval_iter_factory)
  tx, schedule = opt_lib.make_optimizer(c.optim, t.num_steps)
  graphdef, state, shardings = state_lib.create_train_state(
      model_cfg, tx, mesh, c.seed, params=hf_params, rules=sharding_rules(c))
  del hf_params
  run = sources_lib.Run(model_cfg, graphdef, mesh, shardings, t.batch_size, t.seq_len, c.seed,
                        jax.process_index(), jax.process_count())
  if hasattr(source, "bind"):
    source.bind(run)

  ckpt = ckpt_lib.Checkpointer(workdir, c.checkpoint.every, c.checkpoint.keep,
                               c.checkpoint.use_async)
  state, start = _restore(c, ckpt, state, shardings, source)
  config_file = _save_config(c, model_cfg, workdir, start) if primary else ""
  if primary and c.checkpoint.resume:
    _drop_replayed_rows(workdir, start)
  _log_stage(c)

  stage = get_stage(c.stage)
  kind = run_step_kind(c)
  step_fn = kind.compile(graphdef, tx, schedule, _step_config(c, model_cfg), mesh, shardings,
                         kind.shapes(t.batch_size, t.seq_len))
  # a source that evaluates the policy itself (RL: greedy held-out replies) every eval_every
  policy_eval = (getattr(source, "evaluate", None)
                 if not kind.evaluates and t.eval_every > 0 else None)
  eval_fn = (steps_lib.compile_eval(graphdef, mesh, shardings, XENT.shapes(t.batch_size, t.seq_len))
             if kind.evaluates and eval_source is not None and t.eval_every > 0 else None)
  meter = _Meter(model_cfg, t, measure_cpu=t.log_every > 0)
  writer = metrics_lib.MetricsWriter(workdir, enabled=primary)
  meta = {"model": model_cfg.to_dict(), "tokenizer": tok_path, "stage": c.stage}
  end_step = min(t.num_steps, t.stop_after) if t.stop_after else t.num_steps
  summary: dict[str, Any] = {"workdir": workdir, "start_step": start, "config_file": config_file,
                             "peak_flops": meter.peak, "peak_source": meter.peak_source,
                             "flops_per_token": meter.flops_per_token}
  losses, step, loss = [], start, None
  bar = _progress(c, start) if primary and t.progress else None
  try:
    if policy_eval is not None and start == 0:  # the starting policy, for reference
      summary["eval_start"] = policy_eval(state)
      if summary["eval_start"]:
        writer.write(0, summary["eval_start"], prefix="eval")
    with _sigterm_flag() as stop:
      # Step N's metrics are read (a host sync) only after step N+1 is dispatched, so the device
      # never waits on the host between steps; they are read at once where something needs them
      # (a checkpoint, an evaluation, a signal, the last step), so a NaN never reaches a saved
      # step and stops the run at most one step late.
      pending: tuple[int, Any] | None = None

      def settle() -> None:
        nonlocal pending, loss
        if pending is None:
          return
        done, m_done = pending
        pending = None
        loss = _checked_loss(m_done, done, kind, ckpt, source, t.seq_len)
        losses.append(loss)
        if bar is not None:
          bar.update(1)
          bar.set_postfix(loss=f"{loss:.4f}")
        if t.log_every and (done % t.log_every == 0 or done == end_step):
          # the source's own figures (rollout/reward seconds, rewards, lengths) beside the step's
          summary.update(meter.log(writer, done, dict(m_done, **_source_metrics(source))))

      while step < end_step:
        state, m = step_fn(state, source.next_batch(state))
        step += 1
        settle()  # the previous step's metrics, now that this step is queued
        meter.add(t.batch_size * t.seq_len)
        pending = (step, m)
        at_eval = t.eval_every > 0 and (step % t.eval_every == 0 or step == end_step)
        saves = c.checkpoint.every > 0 and step % c.checkpoint.every == 0
        if at_eval or saves or stop or step == end_step:
          settle()
        if eval_fn is not None and at_eval:
          summary["eval"] = evaluate(eval_fn, state, eval_source(), t.eval_batches)
          writer.write(step, summary["eval"], prefix="eval")
        if policy_eval is not None and at_eval:
          summary["eval"] = policy_eval(state)
          if summary["eval"]:
            writer.write(step, summary["eval"], prefix="eval")
        ckpt.save(step, state, source.get_state(), dict(meta, step=step, loss=loss))
        if stop:
          logging.warning("signal %s: saving step %d and stopping", stop[0], step)
          break
      settle()
      ckpt.save(step, state, source.get_state(), dict(meta, step=step, loss=loss), force=True)
      ckpt.wait()
  finally:
    if bar is not None:
      bar.close()
    writer.close()
    ckpt.close()
  if primary:
    summary["loss_png"] = metrics_lib.plot_losses(workdir)
    if stage.policy:
      summary["reward_png"] = metrics_lib.plot_rewards(workdir)
  if c.export_hf:
    summary["export_hf"] = _export_hf(c, graphdef, state, workdir, tok_path)
  summary.update(losses=losses, final_step=step, last_good_step=step if losses else None,
                 stopped_by_signal=bool(stop))
  return summary


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


# ----------------------------------------------------------------------- set-up helpers
def _init_distributed(d: ml_collections.ConfigDict) -> None:
  if d.coordinator_address or d.auto:
    explicit = bool(d.coordinator_address)
    shd.initialize_distributed(d.coordinator_address or None,
                               d.num_processes if explicit else None,
                               d.process_id if explicit else None, d.timeout_s,
                               d.cpu_collectives or None)


def _warn_if_replicated(c: ml_collections.ConfigDict, mesh) -> None:
  dp = int(np.prod([mesh.shape[a] for a in shd.BATCH_AXES]))
  rows = c.train.batch_size // c.train.micro_batches
  left = shd.replicated_batch_axes(rows, mesh)
  if left:
    ways = int(np.prod([mesh.shape[a] for a in left]))
    logging.warning("train.batch_size/micro_batches = %d rows a micro-batch do not split over the "
                    "%d devices of the batch axes: activations are replicated over %s (%dx the "
                    "compute and activation memory of an even split%s); choose batch_size / "
                    "micro_batches divisible by %d", rows, dp, "+".join(left), ways,
                    ", and the MoE runs without its all-to-all dispatch" if "expert" in left
                    else "", dp)


def _model_and_init(c: ml_collections.ConfigDict, model_cfg):
  """(model config, initial parameters or None): the config's model, or the Hugging Face
  checkpoint of `init_from_hf` with its own architecture and our run-time settings."""
  if not c.init_from_hf:
    return model_cfg, None
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from lwm_jax import hf  # pylint: disable=import-outside-toplevel
  keep = ("moe_backend", "capacity_factor", "remat", "ep_capacity_factor", "scan_layers",
          "norm_backward", "attention_backward")
  hf_model = hf.load_pretrained(c.init_from_hf, dtype="float32",
                                **{k: v for k, v in model_cfg.to_dict().items() if k in keep})
  loaded = hf_model.cfg.replace(dtype=model_cfg.dtype, param_dtype="float32")
  seq_len = int(c.train.seq_len)
  if seq_len > loaded.max_position_embeddings:
    # continued training on rows longer than the start's context: the model's context is the
    # longest row it trained on (what the export records and a sampler cuts history to)
    logging.info("init_from_hf %s has a context of %d positions; train.seq_len %d extends it to "
                 "%d", c.init_from_hf, loaded.max_position_embeddings, seq_len, seq_len)
    loaded = loaded.replace(max_position_embeddings=seq_len)
  return loaded, nnx.state(hf_model)


def _sources(c, model_cfg, given, given_eval):
  """(train source, eval factory or None, tokenizer path): the configured data unless given."""
  pi, pc = jax.process_index(), jax.process_count()
  if c.data.source == "rollouts":
    if given is None:
      raise ValueError("config.data.source: 'rollouts' samples from the policy with the "
                       "stage's own source; build it with lwm_jax.stages.rollout_source(config) "
                       "and pass it as source= (launch/train.py does)")
    tok = os.path.abspath(c.data.tokenizer) if c.data.tokenizer else ""
    return sources_lib.as_source(given), given_eval, tok
  if c.data.source == "synthetic":
    source, evals, tok = synthetic.sources_from_config(c, model_cfg.vocab_size, pi, pc)
  elif c.data.source == "drills":
    source, evals, tok = sources_lib.drill_source(c, model_cfg, pi, pc)
  else:
    source, evals, tok = sources_lib.pipeline_source(c, model_cfg, c.stage, pi, pc)
  if given is not None:
    source = sources_lib.as_source(given)
  return source, given_eval if given_eval is not None else evals, tok


def _restore(c, ckpt, state, shardings, source):
  """(state, step): the latest checkpoint's state and the source's position, when resuming."""
  if not c.checkpoint.resume or ckpt.latest_step() is None:
    return state, 0
  restored, source_state, _ = ckpt.restore(state)
  source.set_state(source_state)
  state = jax.device_put(restored, shardings)
  start = int(state.step)
  logging.info("resumed from %s/%d", ckpt.dir, start)
  return state, start


def _save_config(c, model_cfg, workdir: str, start: int) -> str:
  resolved = c.to_dict()
  resolved.update(model=model_cfg.to_dict(), workdir=workdir, process_count=jax.process_count())
  return save_run_config(workdir, resolved, start)


def _drop_replayed_rows(workdir: str, start: int) -> None:
  """A run killed after logging steps past its last checkpoint replays them: drop those rows."""
  n = metrics_lib.drop_rows_after(os.path.join(workdir, "metrics.jsonl"), start)
  if n:
    logging.warning("metrics.jsonl: dropped %d rows past step %d (the steps this start replays)",
                    n, start)


def _log_stage(c: ml_collections.ConfigDict) -> None:
  if get_stage(c.stage).thinking and c.data.source == "pipeline" and c.data.pipeline.thinking:
    if c.data.thinking_target == "empty":
      logging.warning("SFT in thinking mode: every target's <think></think> block is EMPTY "
                      "(data.thinking_target='empty'); the model learns to answer without "
                      "reasoning until teacher reasoning is supplied (set 'recorded' to train on "
                      "reasoning stored in trajectories' meta['think'])")
    elif c.data.thinking_target == "instruction":
      logging.warning("SFT in thinking mode: <think> restates each sample's simulation "
                      "instruction, or says there is none (data.thinking_target='instruction')")
    else:
      logging.warning("SFT in thinking mode: <think> holds each trajectory's meta['think'] for "
                      "the target turn, and is empty where a trajectory has none "
                      "(data.thinking_target='recorded')")


def token_advantages(c) -> bool:
  """Whether the run's batches carry advantages per token ([B, S]) rather than per row: agent RL
  with `agent.credit="turn"` (lwm_jax/rl/agent_episodes.py)."""
  return (get_stage(c.stage).policy and "agent" in c
          and c.agent.get("credit", "episode") == "turn")


def _step_config(c, model_cfg) -> steps_lib.StepConfig:
  t = c.train
  eps_low, eps_high = c.rl.eps_low, c.rl.eps_high
  if get_stage(c.stage).policy:
    eps_low, eps_high = losses_lib.clip_band(c.rl.algo, c.rl.eps_low, c.rl.eps_high)
    own = losses_lib.CLIP_BANDS[c.rl.algo]
    logging.warning("policy loss %s: clip band [1 - %g, 1 + %g] (%s)", c.rl.algo, eps_low,
                    eps_high, "the algorithm's own" if (eps_low, eps_high) == own
                    else "set by rl.eps_low / rl.eps_high")
  return steps_lib.StepConfig(
      micro_batches=t.micro_batches,
      aux_loss_coef=t.aux_loss_coef if t.aux_loss_coef >= 0 else model_cfg.router_aux_loss_coef,
      router_z_loss_coef=model_cfg.router_z_loss_coef, z_loss_coef=t.z_loss_coef,
      xent_chunk=t.get("xent_chunk", 0),
      algo=c.rl.algo, eps_low=eps_low, eps_high=eps_high,
      log_ratio_cap=c.rl.log_ratio_cap or None, kl_coef=c.rl.kl_coef)


def _progress(c, start: int):
  from tqdm import tqdm  # pylint: disable=import-outside-toplevel
  return tqdm(total=c.train.num_steps, initial=start, desc=c.stage, dynamic_ncols=True)


def _export_hf(c, graphdef, state, workdir: str, tok_path: str | None) -> str:
  """The final parameters as an HF folder with the run's tokenizer and generation config."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from lwm_jax import hf  # pylint: disable=import-outside-toplevel
  out = c.export_hf_dir or os.path.join(workdir, "hf")
  hf.save_pretrained(nnx.merge(graphdef, jax.device_get(state.params)), out,
                     tokenizer=tok_path or None, generation=c.init_from_hf or None)
  return out


# ----------------------------------------------------------------------- loop helpers
def _source_metrics(source: Any) -> dict[str, float]:
  return {f"rollout/{k}": float(v) for k, v in (getattr(source, "metrics", None) or {}).items()}


def _checked_loss(m: dict, step: int, kind: StepKind, ckpt, source, seq_len: int) -> float:
  """The step's loss; stops the run on a NaN/inf loss or a batch with nothing to learn from."""
  loss = float(m["loss"])
  if not math.isfinite(loss):
    ckpt.wait()
    last = ckpt.last_good_step()  # the newest step whose files still verify
    raise TrainingDiverged(
        f"loss is {loss} at step {step}; stopping. The last checkpoint that verifies against its "
        f"checksums is {ckpt.dir}/{last}" if last is not None else
        f"loss is {loss} at step {step}; stopping (no saved checkpoint verifies against its "
        "checksums: none was saved yet, or they have no checksums.json).")
  if float(m[kind.target_metric]) == 0 and not kind.empty_ok:
    raise EmptyBatchError(
        f"step {step}: no token of the batch carries loss weight, so there is nothing to train "
        f"on ({sources_lib.describe(source)}, train.seq_len={seq_len}). Documents whose "
        f"observations all fall past train.seq_len give such batches: raise train.seq_len or "
        f"check the data's loss masking.")
  return loss


class _Meter:
  """Tokens per second and MFU over the steps since the last log."""

  def __init__(self, model_cfg, t: ml_collections.ConfigDict, measure_cpu: bool):
    self.flops_per_token = metrics_lib.flops_per_token(model_cfg, t.seq_len)
    self.peak, self.peak_source = metrics_lib.peak_flops_per_device(measure_cpu=measure_cpu)
    self.peak_total = self.peak * jax.device_count()
    self.t0, self.tokens = time.perf_counter(), 0

  def add(self, tokens: int) -> None:
    self.tokens += tokens

  def log(self, writer, step: int, m: dict) -> dict[str, float]:
    tps = self.tokens / max(time.perf_counter() - self.t0, 1e-9)
    mfu = tps * self.flops_per_token / self.peak_total if self.peak_total > 0 else float("nan")
    writer.write(step, dict(jax.device_get(m), tokens_per_s=tps, mfu=mfu))
    self.t0, self.tokens = time.perf_counter(), 0
    return {"tokens_per_s": tps, "mfu": mfu}


@contextlib.contextmanager
def _sigterm_flag():
  """A list that receives the signal number when SIGTERM arrives (main thread only)."""
  got: list[int] = []
  if threading.current_thread() is not threading.main_thread():
    yield got
    return
  old = signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))
  try:
    yield got
  finally:
    signal.signal(signal.SIGTERM, old)
