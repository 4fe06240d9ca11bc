"""Does the world model show the screen the real phone shows? The scripted agent plays held-out
android tasks in the real environment; the same actions then go, turn by turn, to a
`SimulatedEnv` of the world model (free-running: the simulation sees its own earlier
observations, as in Sim RL). Per turn we compare the `screen="..."` attribute of the real and the
simulated view hierarchy, and per episode the verdicts: the real check (`verify.check`), the
transcript rule on the real transcript and on the simulated one (what Sim RL rewards).

  python experiments/agent_rl_android/sim_screens.py [WORLD_MODEL] [TASKS]
"""
import collections
import json
import random
import re
import sys

from lwm_jax.envs import base, verify, verify_transcript
from lwm_jax.sampling.sampler import Sampler, SamplingParams
from lwm_jax.sim import env as sim_env

SCREEN = re.compile(r'screen="([^"]*)"')


def screen(obs: str) -> str:
  m = SCREEN.search(obs)
  return m.group(1) if m else "-"


def main(wm: str = "data/world_model", n: int = 32) -> None:
  sampler = Sampler.from_checkpoint(wm, decode_layout="model")
  params = SamplingParams(temperature=0.0, max_new_tokens=384)
  real, spare = base.make_env("android"), base.make_env("android")
  plays = []
  for seed in verify.task_seeds("heldout", int(n)):
    real.reset(seed)
    agent = base.make_agent("android", random.Random(seed))
    agent.begin(real, real.describe().initial_state)
    last, turns = real.describe().initial_state, []
    for _ in range(8):
      action = agent.act(last)
      if action is None:
        break
      last = real.step(action)
      turns.append((action, last))
    plays.append({"seed": seed, "kind": real.goal["kind"], "turns": turns,
                  "real": verify.check(real, turns).success,
                  "real_transcript": verify_transcript.check_transcript("android", seed, turns,
                                                                         spare).success})
  sims = []
  for p in plays:
    e = sim_env.SimulatedEnv(sampler, sim_env.World.from_env(spare, p["seed"]), params=params,
                             max_turns=10)
    e.reset(p["seed"])
    sims.append(e)
  sim_turns = [[] for _ in plays]
  for t in range(max(len(p["turns"]) for p in plays)):
    live = [i for i, p in enumerate(plays) if t < len(p["turns"])]
    res = sim_env.step_many([sims[i] for i in live], [plays[i]["turns"][t][0] for i in live])
    for i, r in zip(live, res):
      sim_turns[i].append((plays[i]["turns"][t][0], r.observation))
  rows = collections.defaultdict(collections.Counter)
  for p, st in zip(plays, sim_turns):
    r = rows[p["kind"]]
    r["episodes"] += 1
    r["real_success"] += p["real"]
    r["real_transcript_success"] += p["real_transcript"]
    r["sim_transcript_success"] += verify_transcript.check_transcript(
        "android", p["seed"], st, spare).success
    for (a, ro), (_, so) in zip(p["turns"], st):
      r["turns"] += 1
      r["same_screen"] += screen(ro) == screen(so)
      r["same_text"] += ro.strip() == so.strip()
  total = collections.Counter()
  for r in rows.values():
    total.update(r)
  rows["all"] = total
  print("| task kind | episodes | real success | transcript rule on the real turns | on the "
        "simulated turns | turns | same screen | identical observation |")
  print("|---|---|---|---|---|---|---|---|")
  for k, r in sorted(rows.items()):
    print(f"| {k} | {r['episodes']} | {r['real_success']} | {r['real_transcript_success']} | "
          f"{r['sim_transcript_success']} | {r['turns']} | {r['same_screen'] / r['turns']:.2f} | "
          f"{r['same_text'] / r['turns']:.2f} |")
  ex = next(i for i, p in enumerate(plays) if p["kind"] == "settings")
  print(json.dumps({"example_seed": plays[ex]["seed"], "real": plays[ex]["turns"][:2],
                    "sim": sim_turns[ex][:2]}, indent=1)[:4000])


if __name__ == "__main__":
  main(*sys.argv[1:])
