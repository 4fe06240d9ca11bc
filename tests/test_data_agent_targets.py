"""Behaviour-cloning targets: loss on the agent's actions only, observations as context."""
from __future__ import annotations

import glob
import gzip
import json
import os

import numpy as np
import pytest

from lwm_jax.data import agent_targets as at
from lwm_jax.data import pipeline, schema
from lwm_jax.data import tokenizer as tk
from lwm_jax.envs import verify_transcript

CORPUS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "corpus")


def crafted() -> schema.Trajectory:
  turns = [("ls notes", "a.txt  b.txt\nroot@sandbox:~# "),
           ("cat notes/a.txt", "buy milk\nroot@sandbox:~# "),
           ("mv notes/a.txt notes/a.md", "root@sandbox:~# ")]
  return schema.Trajectory(id="bc-1", domain="terminal", task="Rename the notes to .md.",
                           action_space="One bash command line per turn.",
                           initial_state="Files under ~: notes/a.txt notes/b.txt",
                           turns=[schema.Turn(a, o) for a, o in turns])


def corpus_sample(n: int = 6) -> list[schema.Trajectory]:
  out = []
  for path in sorted(glob.glob(os.path.join(CORPUS, "*_test.jsonl.gz"))):
    with gzip.open(path, "rt") as f:
      for _, line in zip(range(n), f):
        out.append(schema.Trajectory.from_dict(json.loads(line)))
  return out


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  texts = [at.agent_system_prompt(t) for t in corpus_sample() + [crafted()]]
  for t in corpus_sample() + [crafted()]:
    texts += [x.action for x in t.turns] + [at.observation_message(x.observation) for x in t.turns]
  return tk.load_tokenizer(tk.train_sentencepiece(texts, 700, tmp_path_factory.mktemp("sp") / "s"))


def cfg(**kw):
  c = pipeline.default_data_config()
  c.update(dict(seq_len=4096, batch_size=2, num_epochs=1, num_packing_bins=2, seed=1, shuffle=False))
  c.update(kw)
  return c


def weighted_runs(tok, sample) -> list[str]:
  """The text of each maximal run of weighted tokens, each of which must end in <|im_end|>."""
  ids, w = sample["tokens"], sample["loss_weights"]
  runs, cur = [], []
  for i, x in zip(ids, w):
    if x > 0:
      cur.append(int(i))
    elif cur:
      runs.append(cur)
      cur = []
  if cur:
    runs.append(cur)
  for r in runs:
    assert r[-1] == tok.im_end_id
  return [tok.decode(r[:-1]) for r in runs]


def test_turn_samples_weigh_exactly_the_target_action(tok):
  traj = crafted()
  samples = at.agent_samples(traj, tok, cfg())
  assert len(samples) == len(traj.turns) + 1
  targets = [t.action for t in traj.turns] + [at.FINISH_ACTION]
  for k, (s, target) in enumerate(zip(samples, targets)):
    assert weighted_runs(tok, s) == [target]
    assert set(np.unique(s["loss_weights"])) <= {0.0, 1.0}
    context = tok.decode(s["tokens"][:int(np.argmax(s["loss_weights"] > 0))])
    assert traj.initial_state in context and traj.task in context
    for j, t in enumerate(traj.turns):  # earlier observations and actions are there, later ones not
      assert (at.observation_message(t.observation) in context) == (j < k)
      assert (f"assistant\n{t.action}<|im_end|>" in context) == (j < k)


def test_rollout_prompt_is_the_cloned_context(tok):
  traj = crafted()
  msgs = at.next_action_messages(traj)
  assert msgs == at.agent_messages(traj, len(traj.turns))[:-1] and msgs[-1]["role"] == "user"
  assert msgs[-1]["content"] == at.observation_message(traj.turns[-1].observation)
  finish = at.agent_samples(traj, tok, cfg())[-1]
  assert tok.encode_chat(msgs) == list(finish["tokens"][:len(tok.encode_chat(msgs))])


def test_trajectory_layout_weighs_every_action_in_order(tok):
  traj = crafted()
  [s] = at.agent_samples(traj, tok, cfg(agent_layout="trajectory"))
  assert weighted_runs(tok, s) == [t.action for t in traj.turns] + [at.FINISH_ACTION]
  text = tok.decode(s["tokens"])
  assert all(at.observation_message(t.observation) in text for t in traj.turns)


def test_real_corpus_trajectories_of_every_domain(tok):
  trajs = corpus_sample(2)
  assert {t.domain for t in trajs} == {"terminal", "swe", "search", "web", "android", "os", "mcp"}
  for t in trajs:
    samples = at.agent_samples(t, tok, cfg(seq_len=16384))
    assert [r for s in samples for r in weighted_runs(tok, s)] == [x.action for x in t.turns] + [at.FINISH_ACTION]


def test_overlong_samples_are_dropped_or_lose_old_history(tok):
  traj = crafted()
  full = at.agent_samples(traj, tok, cfg())
  budget = len(full[2]["tokens"]) - 1  # samples of targets 2 and 3 no longer fit
  kept = at.agent_samples(traj, tok, cfg(seq_len=budget))
  assert ["overlong" in s for s in kept] == [False, False, True, True]
  cut = at.agent_samples(traj, tok, cfg(seq_len=budget, overlong="truncate_history"))
  assert all(len(s["tokens"]) <= budget for s in cut)
  assert weighted_runs(tok, cut[3]) == [at.FINISH_ACTION] and cut[3]["n_dropped"][0] >= 1
  assert traj.initial_state not in tok.decode(cut[3]["tokens"])  # the oldest history goes first
  counts = at.count([traj], tok, cfg(seq_len=budget))["terminal"]
  assert counts["samples"] == 2 and counts["overlong_dropped"] == 2


def test_packed_batches_carry_the_same_loss_tokens(tok):
  trajs = [crafted()] + corpus_sample(1)[:3]
  c = cfg(seq_len=8192)
  want = sum(v["loss_tokens"] for v in at.count(trajs, tok, c).values())
  it = at.make_agent_iterator(c, tok, source=trajs)
  got = sum(int((b["loss_weights"] > 0).sum()) for b in it)
  assert got == want and it.stats["loss_tokens"] == want
  with pytest.raises(ValueError, match="agent_layout"):
    at.make_agent_iterator(cfg(agent_layout="bogus"), tok, source=trajs)


def test_cli_counts_the_samples(tok, tmp_path):
  import subprocess
  import sys
  path = tmp_path / "tiny_train.jsonl"
  t = crafted()
  path.write_text("".join(json.dumps(schema.Trajectory.from_dict({**t.to_dict(), "id": f"bc-{i}"}).to_dict()) + "\n"
                          for i in range(2)))
  root = os.path.dirname(os.path.dirname(__file__))
  out = subprocess.run([sys.executable, os.path.join(root, "launch", "data.py"), "agent-targets",
                        f"--inputs={path}", f"--tokenizer={tok.path}"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": root})
  assert out.returncode == 0, out.stderr
  row = next(l for l in out.stdout.splitlines() if l.startswith("terminal"))
  domain, split, n_traj, n_samples, overlong = row.split()[:5]
  assert (split, n_traj, n_samples, overlong) == ("train", "2", "8", "0")  # 3 actions + finish each


def test_cut_after_keeps_the_turns_up_to_the_goal_then_finish(tok):
  a, b = crafted(), crafted()
  b.id = "bc-2"
  solved = {"bc-1": 2, "bc-2": None}
  out, stats = verify_transcript.cut_after([a, b], lambda t: solved[t.id])
  assert [len(t.turns) for t in out] == [2, 3] and len(a.turns) == 3  # the input is untouched
  assert dict(stats) == {"trajectories": 2, "cut": 1, "turns_dropped": 1, "never_solved": 1}
  targets = [weighted_runs(tok, x) for x in at.agent_samples(out[0], tok, cfg())]
  assert targets == [["ls notes"], ["cat notes/a.txt"], [at.FINISH_ACTION]]
  with pytest.raises(ValueError, match="bc-1: solved after 4 turns, but it has 3"):
    verify_transcript.cut_after([a], lambda t: 4)
  # the old in-trainer cut is refused, naming the data-preparation command that replaced it
  with pytest.raises(ValueError, match="'agent_until' is gone.*launch/data.py goal-cut"):
    at.check_config(cfg(agent_until="goal"))
  with pytest.raises(ValueError, match="'agent_layout' must be one of turns, trajectory"):
    at.check_config(cfg(agent_layout="later"))
