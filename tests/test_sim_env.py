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
