"""Agent RL (GSPO on multi-turn episodes): `python launch/train.py
--config=configs/agent_rl.py:PRESET --workdir=DIR --config.data.tokenizer=TOKENIZER
--config.init_from_hf=AGENT_BC_EXPORT [--config.agent.arm=sim --config.agent.world_model=WM]`.

Stage "agent-rl" (lwm_jax/rl/agent_episodes.py): each batch is `agent.tasks_per_batch` training
tasks x `rl.group_size` episodes played by the live policy, in the real environment
(agent.arm="real", in `agent.workers` processes) or in the world model (agent.arm="sim",
`agent.world_model` a checkpoint), scored by the task verifier at the end, with GSPO on the
agent's tokens only, in `rl.updates_per_batch` (4) updates per rollout. Held-out tasks are
played greedily in the REAL environment every
`train.eval_every` steps. Presets: tiny (tiny model, seconds per step on CPU), demo (the demo
model), small, and the released sizes on pods.
"""
import ml_collections

from configs import common

# preset -> (seq_len, tasks per batch, group size, turn limit, tokens per action)
SHAPES = {"tiny": (1024, 2, 4, 4, 48), "demo": (2048, 2, 4, 6, 48), "small": (2048, 4, 8, 8, 64)}
# pods: tasks per batch 0 = as many as make each update one row a chip (the preset's rows per
# micro-batch, its batch over its micro-batches): fewer rows than chips would leave the rows
# replicated over part of the mesh and the MoE without its expert dispatch (docs/pods.md)
POD = (16384, 0, 16, 20, 512)


def get_config(arg: str | None = None):
  preset = arg or "tiny"
  c = common.get_stage_config("agent-rl", preset)
  seq_len, tasks, group, turns, new = SHAPES.get(preset, POD)
  c.data.source = "rollouts"
  c.rl.algo = "gspo"
  c.rl.group_size = group
  # 4 optimizer updates per rollout batch, as world-model RL: the ratio moves, the clip acts
  c.rl.updates_per_batch = 4
  if not tasks:  # the preset's rows per micro-batch in each update
    rows = c.train.batch_size // c.train.micro_batches
    tasks = max(rows * c.rl.updates_per_batch // group, 1)
  c.rl.filter_zero_variance = True
  c.optim.lr = c.optim.lr / 10
  c.optim.warmup_steps = 0
  c.optim.weight_decay = 0.0
  c.train.seq_len = seq_len
  c.train.batch_size = tasks * group // c.rl.updates_per_batch
  c.train.micro_batches = 1
  c.train.eval_every = 5
  c.agent = ml_collections.ConfigDict(dict(
      domain="search",        # one of lwm_jax.envs' domains (docs/agents.md says why search)
      arm="real",             # real | sim
      world_model="",         # the sim arm's world-model checkpoint (HF folder or workdir)
      wm_temperature=0.0,     # the world model's sampling
      wm_max_new_tokens=384,
      wm_loop_guard="off",    # off | cut | resample: the simulator's guard against looping
                              # observations (lwm_jax.sim.env; off: as every run so far)
      workers=2,              # processes stepping the real envs (0: in this process)
      train_tasks=64,         # task seeds verify.task_seeds("train", n)
      eval_tasks=16,          # held-out seeds verify.task_seeds("heldout", n), real env, greedy
      tasks_per_batch=tasks,
      max_turns=turns,
      max_new_tokens=new,     # per action
      reward="credit",        # credit (partial credit, 1 on success) | success (0/1)
      # who gets the episode's reward: "episode" (every turn shares the group-normalised
      # episode advantage) or "turn" (turn t of an episode of T turns gets the discounted return
      # gamma^(T-1-t) x reward, normalised over all turns of the task's group; needs a per-token
      # loss: --config.rl.algo=gspo_token)
      credit="episode",
      gamma=0.9))
  return c
