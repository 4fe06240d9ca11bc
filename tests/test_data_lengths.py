"""Token budgets: over-long SFT/RL samples dropped and counted; CPT windows that keep observations."""
import json
import os

import numpy as np
import pytest

from lwm_jax.data import hygiene, pipeline, prompts, schema
from lwm_jax.data import tokenizer as tk

JSONL = os.path.join(os.path.dirname(__file__), "fixtures", "data", "trajectories.jsonl")


@pytest.fixture(scope="module")
def trajs():
  base = hygiene.filter_trajectories(schema.read_jsonl(JSONL))
  return [schema.Trajectory.from_dict({**t.to_dict(), "id": f"{t.id}-r{r}"})
          for r in range(3) for t in base]


@pytest.fixture(scope="module")
def tok(trajs, tmp_path_factory):
  texts = []
  for t in trajs[:8]:
    texts += [x.action for x in t.turns] + [x.observation for x in t.turns]
    texts += [prompts.system_prompt(t, v) for v in range(12)]
  return tk.load_tokenizer(tk.train_sentencepiece(texts, 600, tmp_path_factory.mktemp("sp") / "s"))


def cfg(**kw):
  c = pipeline.default_data_config()
  c.update(dict(batch_size=2, num_epochs=1, num_packing_bins=2, seed=3, shuffle=False,
                long_prompts=False))
  c.update(kw)
  return c


def _sft_len(tok, t, seed=3):
  k = pipeline.target_turn(t, seed)
  msgs = prompts.render_messages(t, k, prompts.variant_for("sft", t.id, seed), thinking=True)
  return len(tok.encode_chat(msgs))


def _rl_len(tok, t, seed=3):
  msgs = prompts.prompt_messages(t, pipeline.target_turn(t, seed), 0)
  return len(tok.encode_chat(msgs, add_generation_prompt=True))


def _budget(lens):
  """A budget with some samples over it and the last sample under it (so no drop is pending)."""
  budget = int(np.median(lens))
  while lens[-1] > budget:
    budget += 1
  return budget


def test_sft_overlong_samples_are_dropped_and_counted(tok, trajs):
  lens = [_sft_len(tok, t) for t in trajs]
  budget = _budget(lens)
  over = sum(n > budget for n in lens)
  assert 0 < over < len(trajs)
  it = pipeline.make_train_iterator(cfg(seq_len=budget), tok, "sft", source=trajs)
  batches = list(it)
  assert it.stats["overlong_dropped"] == over
  assert it.stats["documents"] == len(trajs) - over
  assert it.stats["dropped_turns"] == 0 and it.stats["cut"] == 0  # nothing shortened
  # Every document is a whole sample: its length is one of the fitting samples' lengths.
  doc_lens = sorted(int(n) for b in batches for row in b["segment_ids"]
                    for n in np.bincount(row)[1:] if n)
  assert doc_lens == sorted(n for n in lens if n <= budget)


def test_rl_prompts_overlong_dropped_and_counted(tok, trajs):
  lens = [_rl_len(tok, t) for t in trajs]
  budget = _budget(lens)
  it = pipeline.make_train_iterator(cfg(seq_len=budget, batch_size=1), tok, "rl-prompts",
                                    source=trajs)
  ids = [i for b in it for i in b["ids"]]
  assert ids == [t.id for t, n in zip(trajs, lens) if n <= budget]
  assert it.stats["overlong_dropped"] == sum(n > budget for n in lens) > 0
  assert it.stats["dropped_turns"] == 0


def test_overlong_drop_resumes_exactly(tok, trajs):
  trajs = trajs[:12]
  budget = int(np.median([_sft_len(tok, t) for t in trajs]))  # about half are over
  c = cfg(seq_len=budget, num_epochs=-1, shuffle=True, batch_size=1, num_packing_bins=1)
  it = pipeline.make_train_iterator(c, tok, "sft", source=trajs)
  for _ in range(2):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  ref = [next(it) for _ in range(4)]
  it2 = pipeline.make_train_iterator(c, tok, "sft", source=trajs)
  it2.set_state(state)
  for a in ref:
    b = next(it2)
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  assert it2.stats == it.stats and it.stats["overlong_dropped"] > 0


def test_everything_overlong_is_one_clear_error(tok, trajs):
  it = pipeline.make_train_iterator(cfg(seq_len=64, num_epochs=-1), tok, "sft", source=trajs)
  with pytest.raises(ValueError, match="longer than the token budget"):
    next(it)


def test_truncate_history_policy_still_available(tok, trajs):
  budget = _budget([_sft_len(tok, t) for t in trajs])
  it = pipeline.make_train_iterator(cfg(seq_len=budget, overlong="truncate_history"), tok, "sft",
                                    source=trajs)
  list(it)
  assert it.stats["documents"] == len(trajs) and it.stats["overlong_dropped"] == 0
  assert it.stats["dropped_turns"] > 0
  with pytest.raises(ValueError, match="overlong"):
    pipeline.make_train_iterator(cfg(overlong="cut"), tok, "sft", source=trajs)


def _long_action_space(t):
  tools = "\n".join(f"  tool_{i}(path, mode='r')   reads part {i} of the workspace, "
                    f"returning its lines with numbers" for i in range(60))
  return schema.Trajectory.from_dict({**t.to_dict(), "action_space": "Tools:\n" + tools})


def test_cpt_short_budget_still_carries_observations(tok, trajs):
  long = [_long_action_space(t) for t in trajs[:8]]
  c = cfg(seq_len=256, loss_masking=False)
  sys_len = len(tok.encode_message(
      {"role": "system", "content": prompts.system_prompt(long[0], 1)})[0])
  assert sys_len > 256  # the system prompt alone is longer than a row
  for t in long:
    docs = pipeline.cpt_samples(t, tok, c)
    assert all(len(d["tokens"]) <= 256 for d in docs)
    assert all((d["loss_weights"] > 0).sum() > 0 for d in docs), t.id
    text = "".join(tok.decode(d["tokens"][d["loss_weights"] > 0]) for d in docs)
    for x in t.turns:  # short observations land whole in some document's loss
      if len(tok.encode(x.observation)) < 64:
        assert x.observation in text, (t.id, x.observation)
  it = pipeline.make_train_iterator(c, tok, "cpt", source=long)
  batches = list(it)
  assert all((b["loss_weights"] > 0).sum() > 0 for b in batches)
  assert it.stats["loss_tokens"] > 0


def test_cpt_windows_shorten_system_then_cut_the_pair(tok):
  from lwm_jax.data import lengths
  sys = tok.encode_message({"role": "system", "content": "rule " * 300})
  im_end_tail = sys[0][-2:]  # <|im_end|> and the newline after it stay
  user = ([7] * 60, [0.0] * 60)
  obs = ([9] * 120, [1.0] * 120)
  assert len(sys[0]) + 180 > 256
  docs, cut = lengths.cpt_windows(tok, sys, [(user, obs)], 256)
  ((ids, w),) = docs
  # The whole turn fits once the system prompt's content is shortened from its end.
  assert cut == 0 and len(ids) == 256 and ids[:3] == sys[0][:3]
  assert ids[-180:] == [7] * 60 + [9] * 120 and ids[-182:-180] == im_end_tail
  assert w[-120:] == [1.0] * 120 and sum(w) == 120
  big_user = ([7] * 400, [0.0] * 400)
  docs, cut = lengths.cpt_windows(tok, sys, [(big_user, obs)], 256)
  ((ids, w),) = docs
  # The system prompt keeps a quarter of the row; the action gets half of the rest.
  room = 256 - 256 // 4
  assert cut == 1 and len(ids) == 256 and ids[256 // 4 - 2:256 // 4] == im_end_tail
  assert ids.count(7) == room // 2 and ids.count(9) == room - room // 2 and sum(w) == room // 2
