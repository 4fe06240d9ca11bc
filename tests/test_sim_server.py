"""The simulated-environment HTTP server on a real uvicorn server and a tiny random model: 16
concurrent episodes batched onto one engine (answers equal to stepping each episode alone in
Python), the Python client and RemoteEnv, and bad requests answered with 4xx while it keeps
serving."""
from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest

from lwm_jax.data import schema
from lwm_jax.envs import base as envs_base
from lwm_jax.envs import verify, verify_transcript
from lwm_jax.sampling.background import BackgroundServer
from lwm_jax.sim.client import RemoteEnv, SimClient, SimServerError
from lwm_jax.sim.env import SimulatedEnv
from lwm_jax.sim.server import create_app
from tests.sim_helpers import GREEDY, terminal_world, tiny_sampler


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  sampler = tiny_sampler()
  # Batches of at most 4 steps keep every engine call in the one compiled shape of these tests.
  app = create_app(sampler, max_batch=4, window_ms=100, max_tokens=GREEDY.max_new_tokens,
                   max_turns=3, max_episodes=40,
                   trajectory_root=str(tmp_path_factory.getbasetemp()))
  with BackgroundServer(app) as server:
    yield sampler, app, server.url


def _world(i: int) -> dict:
  return terminal_world(task=f"t{i}").to_dict()


@pytest.mark.slow  # heavy (tens of seconds): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_sixteen_concurrent_episodes_are_batched_and_match_python(served):
  sampler, app, base = served
  client = SimClient(base)
  batches0 = app.state.batcher.batches

  def play(i: int):
    ep = client.create(_world(i), seed=i, max_tokens=GREEDY.max_new_tokens)
    out = [ep.step(f"wc -l file{i}.txt"), ep.step("ls")]
    ep.close()
    return out

  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    results = list(pool.map(play, range(16)))
  steps = 32
  assert app.state.batcher.batches - batches0 < steps  # steps shared engine calls
  for i in (0, 7, 15):  # reference: the same episode stepped alone through the Python API
    env = SimulatedEnv(sampler, terminal_world(task=f"t{i}"), params=GREEDY, max_turns=3)
    env.reset(i)
    for r, action in zip(results[i], [f"wc -l file{i}.txt", "ls"]):
      ref = env.step_result(action)
      assert r.info["raw"] == ref.info["raw"] and r.observation == ref.observation
  assert client.health()["episodes"] == 0  # every episode was closed


def test_bad_requests_are_4xx_and_the_server_keeps_serving(served, tmp_path):
  _, _, base = served
  h = httpx.Client(base_url=base, timeout=60)
  world = _world(0)

  def err(r, status, text):
    assert r.status_code == status, r.text
    assert text in r.json()["error"]["message"], r.json()

  err(h.post("/v1/episodes/ep-nope/step", json={"action": "ls"}), 404, "no such episode")
  err(h.delete("/v1/episodes/ep-nope"), 404, "no such episode")
  err(h.post("/v1/episodes", content=b"{not json"), 400, "body: not valid JSON")
  err(h.post("/v1/episodes", json=[1, 2]), 400, "expected a JSON object")
  err(h.post("/v1/episodes", json={}), 400, "give exactly one of world, trajectory")
  err(h.post("/v1/episodes", json={"world": world, "colour": 1}), 400, "colour: unknown field")
  err(h.post("/v1/episodes", json={"world": dict(world, domain="moon")}), 400,
      "world.domain: unknown domain 'moon'")
  err(h.post("/v1/episodes", json={"world": world, "perturb": "errors:rate=3"}), 400,
      "perturbation 'errors': rate must be in [0, 1]")
  err(h.post("/v1/episodes", json={"world": world, "max_turns": "ten"}), 400,
      "max_turns: expected int")
  err(h.post("/v1/episodes", json={"trajectory_file": str(tmp_path / "none.jsonl")}), 400,
      "none.jsonl")
  err(h.post("/v1/episodes", json={"trajectory_file": "/etc/passwd"}), 400,
      "outside the server's trajectory root")
  err(h.post("/v1/episodes", json={"trajectory_file": "../../etc/passwd"}), 400,
      "outside the server's trajectory root")
  ep = h.post("/v1/episodes", json={"world": world, "max_turns": 1}).json()["episode_id"]
  err(h.post(f"/v1/episodes/{ep}/step", content=b"[]"), 400, "expected a JSON object")
  err(h.post(f"/v1/episodes/{ep}/step", json={"act": "ls"}), 400, "action: expected a string")
  r = h.post(f"/v1/episodes/{ep}/step", json={"action": "ls"}).json()
  assert r["done"] and r["truncated"]
  err(h.post(f"/v1/episodes/{ep}/step", json={"action": "ls"}), 409, "is over")
  assert h.delete(f"/v1/episodes/{ep}").json()["closed"]
  err(h.post(f"/v1/episodes/{ep}/step", json={"action": "ls"}), 404, "no such episode")
  assert h.get("/health").json()["status"] == "ok"  # still up


def test_the_campaigns_500s_are_400s_naming_the_field(served):
  """Issue 68, point 6: each of these answered 500 (TypeError, RecursionError,
  UnicodeEncodeError, the tokenizer's RuntimeError)."""
  _, _, base = served
  h = httpx.Client(base_url=base, timeout=60)
  world = _world(0)

  def err(r, text):
    assert r.status_code == 400, r.text
    assert text in r.json()["error"]["message"], r.json()

  err(h.post("/v1/episodes", json={"world": dict(world, finish_actions=5)}), "world.finish_actions")
  err(h.post("/v1/episodes", json={"world": dict(world, finish_actions="abc")}), "world.finish_actions")
  deep = "[" * 50_000 + "]" * 50_000
  body = json.dumps({"world": dict(world, goal={"x": 0})}).replace('{"x": 0}', '{"x": %s}' % deep)
  err(h.post("/v1/episodes", content=body.encode()), "nested too deeply")
  goal = {"g": 0}
  for _ in range(200):
    goal = {"g": goal}
  err(h.post("/v1/episodes", json={"world": dict(world, goal=goal)}), "world.goal: nested deeper")
  surrogate = b'{"world": ' + json.dumps(dict(world, task="@@")).encode().replace(b"@@", b"\\ud800") + b"}"
  err(h.post("/v1/episodes", content=surrogate), "world.task: not valid Unicode")
  ep = h.post("/v1/episodes", json={"world": world}).json()["episode_id"]
  err(h.post(f"/v1/episodes/{ep}/step", content=b'{"action": "\\ud800"}'), "action: not valid Unicode")
  assert h.delete(f"/v1/episodes/{ep}").json()["closed"]
  err(h.post("/v1/episodes", json={"world": world, "seed": 1.5}), "seed: expected int")
  assert h.get("/health").json()["status"] == "ok"


def test_simulated_env_and_world_give_the_same_clear_errors():
  from lwm_jax.sim.env import World
  world = _world(0)
  for bad, text in [(dict(world, finish_actions=5), "finish_actions"),
                    (dict(world, task="\ud800"), "world.task: not valid Unicode")]:
    with pytest.raises(ValueError, match=text):
      World.from_dict(bad)


def test_trajectory_file_perturbation_and_remote_env(served, tmp_path):
  _, _, base = served
  traj = schema.Trajectory("demo-1", "mcp", "Refund order 3.", "{\"tool\": ...}",
                           "Connected to shop-db.", [schema.Turn("x", "y")])
  path = tmp_path / "t.jsonl"
  path.write_text(json.dumps(traj.to_dict()) + "\n")
  client = SimClient(base)
  ep = client.create(trajectory_file=str(path), trajectory_id="demo-1",
                     perturb="errors:rate=0.5,kind=unavailable")
  assert ep.initial_state == "Connected to shop-db."
  assert "about 50% of the agent's calls fail because the service is temporarily unavailable" \
      in ep.world["simulation_instruction"]
  done = ep.step('{"tool": "finish", "arguments": {}}')
  assert done.terminated and done.observation == ""
  assert ep.state()["trajectory"]["turns"][0]["action"].startswith('{"tool": "finish"')
  ep.close()
  with pytest.raises(SimServerError) as e:
    client.create(trajectory_file=str(path), trajectory_id="nope")
  assert e.value.status == 400 and "no trajectory with id 'nope'" in e.value.message
  env = RemoteEnv(client, terminal_world(), max_turns=2)
  assert env.reset(3) == "user@box:~$ " and env.describe().task == terminal_world().task
  assert isinstance(env.step("ls"), str) and env.step_result("pwd").truncated
  env.close()
  assert client.health()["episodes"] == 0


def test_task_episodes_are_the_real_task_and_judged_by_its_verifier(served):
  """A `task` episode's world is the real environment's episode at that seed; its last step's
  reward is the transcript verifier's credit on the simulated turns (checked here directly)."""
  _, _, base = served
  client = SimClient(base)
  seed = verify.task_seeds("heldout", 1)[0]
  real = envs_base.make_env("search")
  try:
    real.reset(seed)
    info, goal = real.describe(), real.goal
  finally:
    real.close()
  ep = client.create(task={"domain": "search", "seed": seed}, max_turns=3)
  assert ep.initial_state == info.initial_state and ep.world["task"] == info.task
  assert ep.world["goal"] == goal
  mid = ep.step(f'search(query="{goal["target"]}")')
  assert not mid.done and mid.reward == 0.0 and "verdict" not in mid.info
  end = ep.step('answer(text="done")')
  assert end.terminated
  turns = ep.state()["trajectory"]["turns"]
  ref = verify_transcript.check_transcript(
      "search", seed, [schema.Turn(t["action"], t["observation"]) for t in turns])
  assert end.reward == ref.credit
  assert end.info["verdict"] == {"success": ref.success, "credit": ref.credit,
                                 "reason": ref.reason}
  ep.close()
  h = httpx.Client(base_url=base, timeout=60)
  for body, text in (({"task": {"domain": "moon", "seed": 1}}, "task.domain: 'moon'"),
                     ({"task": {"domain": "search", "seed": -1}}, "task.seed"),
                     ({"task": {"domain": "search"}}, 'task: expected {"domain"'),
                     ({"task": {"domain": "search", "seed": 1}, "world": _world(0)},
                      "give exactly one of")):
    r = h.post("/v1/episodes", json=body)
    assert r.status_code == 400 and text in r.json()["error"]["message"], r.text
  assert client.health()["episodes"] == 0


def test_the_loop_guard_over_http_matches_python_and_reports_in_info(served, monkeypatch):
  sampler, app, base = served
  client = SimClient(base)
  # the tiny model's replies are no loops: the guarded step equals the Python env's
  ep = client.create(_world(1), seed=1, max_tokens=GREEDY.max_new_tokens, loop_guard="resample")
  got = ep.step("ls")
  env = SimulatedEnv(sampler, terminal_world(task="t1"), params=GREEDY, max_turns=3,
                     loop_guard="resample")
  env.reset(1)
  ref = env.step_result("ls")
  assert got.observation == ref.observation
  assert got.info["loop_guard"] == ref.info["loop_guard"] == {"looped": False, "resamples": 0,
                                                              "cut": False}
  ep.close()
  # every draw reads as a loop: resample draws LOOP_RESAMPLES more times, then cuts
  from lwm_jax.sim import env as sim_env
  monkeypatch.setattr(sim_env, "looping", lambda gen: True)
  before = app.state.batcher.batches
  ep = client.create(_world(2), seed=2, max_tokens=GREEDY.max_new_tokens, loop_guard="resample")
  assert ep.step("ls").info["loop_guard"] == {"looped": True,
                                              "resamples": sim_env.LOOP_RESAMPLES, "cut": True}
  assert app.state.batcher.batches - before == 1 + sim_env.LOOP_RESAMPLES
  ep.close()
  ep = client.create(_world(3), seed=3, max_tokens=GREEDY.max_new_tokens, loop_guard="cut")
  assert ep.step("ls").info["loop_guard"] == {"looped": True, "resamples": 0, "cut": True}
  ep.close()
  with pytest.raises(SimServerError, match="loop_guard"):
    client.create(_world(4), loop_guard="always")
