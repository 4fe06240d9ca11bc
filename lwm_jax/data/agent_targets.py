"""Behaviour-cloning samples for an agent policy: the agent's view of a trajectory, with the loss
on its actions only.

The world model reads actions and predicts observations; the agent does the opposite. Here a
trajectory becomes chat samples in which the ASSISTANT is the agent: the system prompt gives the
task and the action space (`agent_system_prompt`, our own template), the first user message the
environment's initial state, and then each action is an assistant message and the observation
it produced the following user message. Observations are context only (weight 0); the target
action's content and its `<|im_end|>` carry weight 1, so the model learns the action and where
it ends. After the last turn the target is `FINISH_ACTION`: the policy learns to end the episode
(the rollout stops at it or at the turn limit).

Two layouts give the same targets:
  "turns"       one sample per action (and one for the finish): the history before it is
                context and only that action is in the loss. Over-long samples follow the
                pipeline's `overlong` policy: dropped and counted, or `truncate_history` (oldest
                turns first, the initial state with them).
  "trajectory"  one sample per trajectory with every action in the loss (causal attention sees
                exactly the same prefix for each action); fewer tokens, but a trajectory longer
                than `seq_len` is dropped and counted.

Samples have the train-sample format of `pipeline` (tokens, loss_weights and the per-sample
counters), so they pack with the same packer; `make_agent_iterator` gives packed batches, resumable
like every other stage (a `pipeline.DataIterator`).

Every recorded turn of a trajectory is cloned. The scripted agents go on acting after the goal
(the world model's corpus wants those turns); an agent that clones them learns to wander past
its goal. Cutting each trajectory at its goal is a data-preparation step that runs the real
environments' transcript rules and writes its output (`python launch/data.py goal-cut`,
`lwm_jax.envs.verify_transcript.cut_at_goal`); the batches here never start an environment.
"""
from __future__ import annotations

import collections
from typing import Any, Sequence

import grain
import ml_collections
import numpy as np

from lwm_jax import domains
from lwm_jax.data import lengths, pipeline
from lwm_jax.data.schema import Trajectory
from lwm_jax.data.tokenizer import Tokenizer

STAGE = "agent-bc"
FINISH_ACTION = "finish()"
LAYOUTS = ("turns", "trajectory")

def agent_system_prompt(traj: Trajectory) -> str:
  """The agent's instructions for `traj`: the world it acts in, its task and its action space."""
  world = domains.get_domain(traj.domain).agent_world
  task = traj.task.strip() or "(no task was given: explore and act sensibly)"
  space = traj.action_space.strip() or "(the action format was not given)"
  return (f"You are an agent operating {world}. Reach the goal below by acting one step at a "
          "time; after each of your actions the environment answers with what happened.\n\n"
          f"Goal:\n{task}\n\nHow to act:\n{space}\n\n"
          "Answer every turn with exactly one action in that format and nothing else: no "
          f"commentary, no quoting. Once the goal is reached, or cannot be reached, answer "
          f"{FINISH_ACTION} to end the episode.")


def _state_message(traj: Trajectory) -> str:
  state = traj.initial_state.strip() or "(the initial state was not recorded)"
  return f"The environment starts like this:\n{state}"


def observation_message(observation: str) -> str:
  """How an observation is shown to the agent (a user message)."""
  return f"Result of your action:\n{observation}"


def agent_messages(traj: Trajectory, upto: int | None = None) -> list[dict[str, str]]:
  """system, user (initial state), then assistant (action k) / user (its observation) for every
  turn before `upto`, and last the assistant target: action `upto` (0-based), or
  `FINISH_ACTION` when `upto` is the number of turns (or None: the whole trajectory, finish
  included, the layout of "trajectory" samples)."""
  n = len(traj.turns)
  last = n if upto is None else upto
  if not 0 <= last <= n:
    raise ValueError(f"trajectory {traj.id}: target action {upto} out of range 0..{n}")
  msgs = [{"role": "system", "content": agent_system_prompt(traj)},
          {"role": "user", "content": _state_message(traj)}]
  for t in traj.turns[:last]:
    msgs.append({"role": "assistant", "content": t.action})
    msgs.append({"role": "user", "content": observation_message(t.observation)})
  target = traj.turns[last].action if last < n else FINISH_ACTION
  msgs.append({"role": "assistant", "content": target})
  return msgs


def next_action_messages(traj: Trajectory) -> list[dict[str, str]]:
  """The agent's prompt after every turn of `traj` (no target): what a rollout gives the policy
  to generate its next action, in exactly the layout it was cloned on."""
  return agent_messages(traj, len(traj.turns))[:-1]


def turn_samples(traj: Trajectory, tok: Tokenizer, cfg: ml_collections.ConfigDict
                 ) -> list[dict[str, np.ndarray]]:
  """One sample per action of `traj` and one for the finish (layout "turns"); an over-long one
  is `lengths.DROPPED` under the 'drop' policy."""
  out = []
  for k in range(len(traj.turns) + 1):
    msgs = agent_messages(traj, k)
    if cfg.get("overlong", "drop") == "drop" and pipeline._too_long(tok, msgs, cfg.seq_len, False):
      out.append(lengths.DROPPED)
      continue
    ids, w, drop, cut = lengths.fit_history(tok, msgs, cfg.seq_len, 1.0)
    out.append(pipeline._arr(ids, w, dropped=drop, cut=cut))
  return out


def trajectory_sample(traj: Trajectory, tok: Tokenizer, cfg: ml_collections.ConfigDict
                      ) -> dict[str, np.ndarray]:
  """The whole trajectory with every action (and the finish) in the loss (layout "trajectory")."""
  ids, w = tok.encode_chat_with_weights(
      agent_messages(traj), lambda i, m: 1.0 if m["role"] == "assistant" else 0.0)
  if len(ids) > cfg.seq_len:
    return lengths.DROPPED
  return pipeline._arr(ids, w)


def agent_samples(traj: Trajectory, tok: Tokenizer, cfg: ml_collections.ConfigDict
                  ) -> list[dict[str, np.ndarray]]:
  """The samples of one trajectory in layout `cfg.agent_layout` (default "turns")."""
  layout = cfg.get("agent_layout", "turns")
  if layout not in LAYOUTS:
    raise ValueError(f"data config field 'agent_layout' must be one of {', '.join(LAYOUTS)}, "
                     f"got {layout!r}")
  if not traj.turns:
    raise ValueError(f"trajectory {traj.id} has no turns: nothing to clone")
  return turn_samples(traj, tok, cfg) if layout == "turns" else [trajectory_sample(traj, tok, cfg)]


def count(trajs: Sequence[Trajectory], tok: Tokenizer, cfg: ml_collections.ConfigDict
          ) -> dict[str, collections.Counter]:
  """Per domain: trajectories, samples kept, over-long samples dropped, history turns dropped to
  fit, tokens and loss (action) tokens of the kept samples."""
  stats: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
  for t in trajs:
    s = stats[t.domain]
    s["trajectories"] += 1
    for x in agent_samples(t, tok, cfg):
      if "overlong" in x:
        s["overlong_dropped"] += 1
        continue
      s["samples"] += 1
      s["history_turns_dropped"] += int(x["n_dropped"][0])
      s["tokens"] += len(x["tokens"])
      s["loss_tokens"] += int((x["loss_weights"] > 0).sum())
  return dict(stats)


def check_config(cfg: ml_collections.ConfigDict) -> None:
  """The agent field of a data config, `agent_layout`; `agent_until` (the old in-trainer cut at
  the goal) is refused with the data-preparation command that replaced it."""
  if cfg.get("agent_layout", "turns") not in LAYOUTS:
    raise ValueError(f"data config field 'agent_layout' must be one of {', '.join(LAYOUTS)}, "
                     f"got {cfg.get('agent_layout')!r}")
  if "agent_until" in cfg:
    raise ValueError(
        "data config field 'agent_until' is gone: cutting trajectories at their goal is a "
        "data-preparation step now; run `python launch/data.py goal-cut --inputs=FILES "
        "--out=CUT.jsonl.gz` and set data.pipeline.jsonl to its output (every recorded turn of "
        "the files given is cloned)")


class AgentFlatMap(grain.experimental.FlatMapTransform):
  """Trajectory -> its agent samples (the grain step of stage "agent-bc")."""
  max_fan_out = 4096

  def __init__(self, tok: Tokenizer, cfg: ml_collections.ConfigDict):
    self.tok, self.cfg = tok, cfg

  def flat_map(self, traj: Trajectory) -> list[dict[str, Any]]:
    return agent_samples(traj, self.tok, self.cfg)


def agent_dataset(source: Sequence[Trajectory], tok: Tokenizer, cfg: ml_collections.ConfigDict,
                  process_index: int = 0, process_count: int = 1) -> grain.IterDataset:
  """Packed [batch, seq_len] batches of agent samples, in the train-batch format of `pipeline`."""
  ds = pipeline.trajectory_dataset(source, cfg, process_index, process_count)
  shard = len(pipeline.shard_source(source, process_index, process_count))
  ds = grain.experimental.FlatMapIterDataset(ds.to_iter_dataset(), AgentFlatMap(tok, cfg))
  ds = lengths.SkipMarked(ds, max(shard, 1) * 64)
  ds = grain.experimental.FirstFitPackIterDataset(
      ds, length_struct={k: cfg.seq_len for k in pipeline._TRAIN_KEYS},
      num_packing_bins=cfg.num_packing_bins, seed=cfg.seed, shuffle_bins=True)
  return ds.map(pipeline._finish_packed(tok)).batch(cfg.batch_size)


def make_agent_iterator(data_cfg: ml_collections.ConfigDict, tokenizer: Tokenizer,
                        process_index: int = 0, process_count: int = 1,
                        source: Sequence[Trajectory] | None = None) -> pipeline.DataIterator:
  """The checkpointable batch iterator of behaviour cloning (stage "agent-bc"); the data config
  is the pipeline's (`default_data_config`) plus `agent_layout`; `source` (default: the files
  the config names) is cloned turn by turn as it stands."""
  check_config(data_cfg)
  pipeline.validate_config(data_cfg, "sft")  # the same fields and limits as SFT
  src = source if source is not None else pipeline.load_source(data_cfg)
  return pipeline.DataIterator(agent_dataset(src, tokenizer, data_cfg, process_index, process_count),
                               STAGE)
