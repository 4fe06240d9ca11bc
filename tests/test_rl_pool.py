"""The RL pool: disjoint, deterministic CPT/SFT/RL split by trajectory id; one v0 prompt per
trajectory at the pipeline's target turn; over-long prompts dropped and counted, never cut."""
from __future__ import annotations

import os

import pytest

from lwm_jax.data import hygiene, pipeline, prompts, schema
from lwm_jax.data import tokenizer as tk
from lwm_jax.data.bench_records import format_action, format_observation
from lwm_jax.rl import pool as pool_lib

JSONL = os.path.join(os.path.dirname(__file__), "fixtures", "data", "trajectories.jsonl")


def fixture_trajs() -> list[schema.Trajectory]:
  return hygiene.filter_trajectories(schema.read_jsonl(JSONL))


def many_trajs(repeat: int = 4) -> list[schema.Trajectory]:
  """The fixture trajectories under fresh ids."""
  return [schema.Trajectory.from_dict({**t.to_dict(), "id": f"{t.id}-r{r}"})
          for r in range(repeat) for t in fixture_trajs()]


def train_tokenizer(directory) -> tk.Tokenizer:
  texts = []
  for t in fixture_trajs():
    texts += [x.action for x in t.turns] + [x.observation for x in t.turns]
    texts += [prompts.system_prompt(t, v) for v in range(12)]
  return tk.load_tokenizer(tk.train_sentencepiece(texts, 400, directory / "sp"))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  return train_tokenizer(tmp_path_factory.mktemp("sp"))


def test_split_is_disjoint_deterministic_and_follows_fractions():
  ids = [f"traj-{i}" for i in range(3000)]
  trajs = [schema.Trajectory(i, "terminal", "t", "a", "s", [schema.Turn("ls", "x")]) for i in ids]
  fr = {"cpt": 0.5, "sft": 0.3, "rl": 0.2}
  a = pool_lib.split_pools(trajs, fr, seed=1)
  b = pool_lib.split_pools(list(reversed(trajs)), fr, seed=1)  # order does not matter
  sets = {k: {t.id for t in v} for k, v in a.items()}
  assert sets == {k: {t.id for t in v} for k, v in b.items()}
  assert not (sets["cpt"] & sets["sft"]) and not (sets["cpt"] & sets["rl"])
  assert not (sets["sft"] & sets["rl"])
  assert set().union(*sets.values()) == set(ids)
  for k, f in fr.items():  # 3000 draws: within 4 standard deviations
    sd = (f * (1 - f) / len(ids)) ** 0.5
    assert abs(len(sets[k]) / len(ids) - f) < 4 * sd, (k, len(sets[k]))
  other = pool_lib.split_pools(trajs, fr, seed=2)
  assert {t.id for t in other["rl"]} != sets["rl"]  # the seed changes the split
  assert pool_lib.pool_of("traj-7", fr, 1) == next(k for k, v in sets.items() if "traj-7" in v)
  only_rl = pool_lib.split_pools(trajs[:50], {"rl": 1.0})
  assert len(only_rl["rl"]) == 50 and not only_rl["cpt"]
  for bad in ({"cpt": 0.5, "sft": 0.2}, {"cpt": 1.2, "rl": -0.2}, {"dpo": 1.0}):
    with pytest.raises(ValueError, match="pool"):
      pool_lib.split_pools(trajs, bad)


def test_pool_prompt_is_v0_at_the_target_turn(tok):
  trajs = fixture_trajs()
  p = pool_lib.build_pool(trajs, tok, max_prompt_tokens=100_000, seed=3)
  assert len(p) == len(trajs) and p.stats["dropped_too_long"] == 0
  for traj, item in zip(trajs, p.items):
    t = pipeline.target_turn(traj, 3)
    assert item.turn == t and item.reference == traj.turns[t].observation
    assert item.action == traj.turns[t].action
    assert item.context == [(x.action, x.observation) for x in traj.turns[:t]]
    # system prompt v0, the whole history, the target action last, then the generation header
    assert item.messages[0] == {"role": "system", "content": prompts.system_prompt(traj, 0)}
    assert len(item.messages) == 2 + 2 * t
    assert item.messages[-1] == {"role": "user", "content": format_action(t + 1, traj.turns[t].action)}
    if t:
      assert item.messages[-2]["content"] == format_observation(traj.turns[t - 1].observation)
    assert item.prompt_ids == tok.encode_chat(item.messages, add_generation_prompt=True)
    assert tok.decode(item.prompt_ids).endswith("<|im_start|>assistant\n")


def test_pool_drops_long_prompts_and_counts_them(tok):
  trajs = fixture_trajs()
  full = pool_lib.build_pool(trajs, tok, max_prompt_tokens=100_000, seed=3)
  lengths = sorted(len(i.prompt_ids) for i in full.items)
  limit = lengths[len(lengths) // 2]
  p = pool_lib.build_pool(trajs, tok, max_prompt_tokens=limit, seed=3)
  n_long = sum(1 for n in lengths if n > limit)
  assert n_long > 0 and p.stats["dropped_too_long"] == n_long and len(p) == len(trajs) - n_long
  # never cut: what is kept is identical to the unlimited pool's prompt
  by_id = {i.id: i for i in full.items}
  for item in p.items:
    assert len(item.prompt_ids) <= limit and item.prompt_ids == by_id[item.id].prompt_ids
  assert sum(p.stats["dropped_per_domain"].values()) == n_long
  assert f"{n_long} dropped" in p.summary()


def test_prompt_order_resumes_exactly_and_splits_processes():
  a = pool_lib.PromptOrder(7, seed=5)
  first = a.take(5)
  state = a.get_state()
  rest = a.take(12)
  b = pool_lib.PromptOrder(7, seed=5)
  b.set_state(state)
  assert b.take(12) == rest
  assert sorted(first + rest[:2]) == list(range(7))  # epoch 0 is a permutation of the pool
  assert sorted(rest[2:9]) == list(range(7))
  p0, p1 = pool_lib.PromptOrder(8, seed=1, process_count=2), pool_lib.PromptOrder(
      8, seed=1, process_index=1, process_count=2)
  x, y = p0.take(4), p1.take(4)
  assert sorted(x + y) == list(range(8))
  with pytest.raises(ValueError, match="empty"):
    pool_lib.PromptOrder(0)


def test_data_cli_reports_the_pool_sizes(tmp_path):
  """`launch/data.py pools` prints the CPT/SFT/RL split of the inputs per domain, the same
  split as `split_pools`, and the RL prompts that fit the token limit."""
  import subprocess
  import sys
  src = tmp_path / "t.jsonl"
  trajs = many_trajs(3)
  src.write_text("".join(__import__("json").dumps(t.to_dict()) + "\n" for t in trajs))
  repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  p = subprocess.run([sys.executable, os.path.join(repo, "launch", "data.py"), "pools",
                      f"--inputs={src}", "--pool_fractions=cpt=0.5,sft=0.25,rl=0.25",
                      "--sp_vocab=400", "--seq_len=900"],
                     capture_output=True, text=True, timeout=300, cwd=repo)
  assert p.returncode == 0, p.stderr[-2000:]
  want = pool_lib.split_pools(hygiene.filter_trajectories(trajs),
                              {"cpt": 0.5, "sft": 0.25, "rl": 0.25})
  lines = {ln.split("|")[0].strip(): ln for ln in p.stdout.splitlines() if "|" in ln}
  for name in ("cpt", "sft", "rl"):
    assert int(lines[name].split("|")[1]) == len(want[name]), (name, p.stdout)
  assert "RL pool: " in p.stdout and "dropped as longer than 900 tokens" in p.stdout
