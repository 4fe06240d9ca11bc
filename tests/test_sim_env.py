"""SimulatedEnv: the world model sees exactly the chat an AgentWorldBench record would give it."""
from lwm_jax.data import bench_records as awb
from lwm_jax.data import prompts
from lwm_jax.data.schema import Trajectory, Turn
from lwm_jax.sampling import Generation
from lwm_jax.sim.env import SimulatedEnv, World


class ScriptedWorldModel:
  """Stands in for a Sampler: records its prompts and replies with a thinking-mode answer."""

  def __init__(self):
    self.prompts = []

  def generate(self, prompts_, params):
    self.prompts.extend(prompts_)
    n = len(self.prompts)
    text = f"<think>turn {n}</think>\n<predicted_observation>out-{n}</predicted_observation>"
    return [Generation(text=text, token_ids=[], logprobs=[], finish_reason="stop")
            for _ in prompts_]


def _traj():
  return Trajectory(id="t1", domain="terminal", task="list files", action_space="bash commands",
                    initial_state="$ ", turns=[Turn("ls", "a b"), Turn("cat a", "hello")],
                    simulation_instruction="the disk is full")


def test_simulated_env_prompts_match_benchmark_rendering():
  traj = _traj()
  wm = ScriptedWorldModel()
  env = SimulatedEnv(wm, World.from_trajectory(traj))
  assert env.reset(seed=3) == "$ "
  obs1 = env.step("ls")
  obs2 = env.step("cat a")
  assert (obs1, obs2) == ("out-1", "out-2")
  assert [t.observation for t in env.trajectory().turns] == ["out-1", "out-2"]
  # The second prompt holds the simulated (not the real) first observation, like a live episode.
  sim = Trajectory(**{**traj.__dict__, "turns": [Turn("ls", "out-1"), Turn("cat a", "")]})
  rec = awb.trajectory_to_records(sim, prompts.system_prompt(sim, 0), [1])[0]
  assert wm.prompts[1] == rec.messages()
  assert "the disk is full" in wm.prompts[0][0]["content"]
  assert "<think>" not in obs1


def test_long_episode_drops_its_oldest_history_to_fit_the_context():
  """Past the model's context the oldest turns leave the prompt (counted in info), the newest
  stay, and the episode goes on instead of failing."""
  import types
  from lwm_jax.sampling import SamplingParams

  class SmallContext(ScriptedWorldModel):
    engine = types.SimpleNamespace(context=900)

    def encode_prompt(self, msgs):  # one token per character
      return [0] * sum(len(m["content"]) for m in msgs)

  wm = SmallContext()
  env = SimulatedEnv(wm, World.from_trajectory(_traj()),
                     params=SamplingParams(temperature=0.0, max_new_tokens=100))
  env.reset()
  dropped = [env.step_result(f"echo {'x' * 60} {i}").info["history_dropped"] for i in range(12)]
  assert dropped[0] == 0 and dropped[-1] > 0 and dropped == sorted(dropped)
  for p in wm.prompts:
    assert wm.encode_prompt(p).__len__() <= 900 - 100
  last = wm.prompts[-1]
  assert last[-1]["content"].endswith(f"echo {'x' * 60} 11\n```")
  assert len(last) == 1 + 2 * (12 - dropped[-1]) - 1


def test_an_observation_written_behind_the_history_header_is_returned_without_it():
  """A model trained without thinking answers as the history turns read (header, then the
  observation): the episode keeps the observation alone, so the next prompt has one header."""

  class HeaderWorldModel(ScriptedWorldModel):
    def generate(self, prompts_, params):
      self.prompts.extend(prompts_)
      return [Generation(text=awb.format_observation(f"out-{len(self.prompts)}\n"), token_ids=[],
                         logprobs=[], finish_reason="stop") for _ in prompts_]

  wm = HeaderWorldModel()
  env = SimulatedEnv(wm, World.from_trajectory(_traj()))
  env.reset(seed=0)
  assert env.step("ls") == "out-1"
  env.step("cat a")
  second = wm.prompts[1][-2]["content"]
  assert second == awb.format_observation("out-1")


class LoopingWorldModel:
  """Replies with a loop to the end for the first `loops` draws of each prompt, then plainly;
  records the params of every draw."""

  LOOP = "from stdplus.numeric import clamp" + ", mean" * 10

  def __init__(self, loops):
    self.loops, self.draws = loops, []

  def generate(self, prompts_, params):
    params = params if isinstance(params, list) else [params] * len(prompts_)
    self.draws.append(list(params))
    text = self.LOOP if len(self.draws) <= self.loops else "from stdplus.numeric import clamp"
    return [Generation(text=text, token_ids=[], logprobs=[], finish_reason="length")
            for _ in prompts_]


def test_loop_guard_off_cut_and_resample():
  import pytest
  from lwm_jax.eval import turn_kinds
  from lwm_jax.sim import env as sim_env
  world = World.from_trajectory(_traj())
  assert turn_kinds.is_loop(LoopingWorldModel.LOOP)
  # off: the loop is the observation; nothing in info
  r = SimulatedEnv(LoopingWorldModel(9), world)
  r.reset(1)
  res = r.step_result("ls")
  assert res.observation == LoopingWorldModel.LOOP and "loop_guard" not in res.info
  # cut: one copy of the repeated unit is kept
  e = SimulatedEnv(LoopingWorldModel(9), world, loop_guard="cut")
  e.reset(1)
  res = e.step_result("ls")
  assert res.observation == "from stdplus.numeric import clamp, mean"
  assert res.info["loop_guard"] == {"looped": True, "resamples": 0, "cut": True}
  # resample: drawn again at a temperature, a different seed each round; the second draw is fine
  wm = LoopingWorldModel(1)
  e = SimulatedEnv(wm, world, loop_guard="resample")
  e.reset(1)
  res = e.step_result("ls")
  assert res.observation == "from stdplus.numeric import clamp"
  assert res.info["loop_guard"] == {"looped": True, "resamples": 1, "cut": False}
  first, again = wm.draws[0][0], wm.draws[1][0]
  assert again.temperature == sim_env.LOOP_RESAMPLE_TEMPERATURE and again.seed != first.seed
  # resample that keeps looping: LOOP_RESAMPLES more draws, then cut
  wm = LoopingWorldModel(99)
  e = SimulatedEnv(wm, world, loop_guard="resample")
  e.reset(1)
  res = e.step_result("ls")
  assert len(wm.draws) == 1 + sim_env.LOOP_RESAMPLES
  assert res.info["loop_guard"] == {"looped": True, "resamples": sim_env.LOOP_RESAMPLES,
                                    "cut": True}
  # a step that does not loop is counted as such
  res = SimulatedEnv(LoopingWorldModel(0), world, loop_guard="resample")
  res.reset(1)
  assert res.step_result("ls").info["loop_guard"] == {"looped": False, "resamples": 0,
                                                      "cut": False}
  with pytest.raises(ValueError, match="loop_guard"):
    SimulatedEnv(wm, world, loop_guard="sometimes")
