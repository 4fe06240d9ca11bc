"""Grain pipelines: packing layout, loss weights, over-long policy, sharding, exact resume, TFDS."""
import collections
import json
import os

import numpy as np
import pytest

from lwm_jax.data import masking, pipeline, prompts, schema, tfds_trajectories
from lwm_jax.data import tokenizer as tk

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "data")
JSONL = os.path.join(FIX, "trajectories.jsonl")


@pytest.fixture(scope="module")
def trajs():
  from lwm_jax.data import hygiene
  return hygiene.filter_trajectories(schema.read_jsonl(JSONL))


@pytest.fixture(scope="module")
def many(trajs):
  """40 trajectories: the fixtures under fresh ids (enough for several batches)."""
  out = []
  for r in range(5):
    for t in trajs:
      out.append(schema.Trajectory.from_dict({**t.to_dict(), "id": f"{t.id}-r{r}"}))
  return out


@pytest.fixture(scope="module")
def tok(trajs, tmp_path_factory):
  texts = []
  for t in trajs:
    texts += [x.action for x in t.turns] + [x.observation for x in t.turns]
    texts += [prompts.system_prompt(t, v) for v in range(12)]
  return tk.load_tokenizer(tk.train_sentencepiece(texts, 600, tmp_path_factory.mktemp("sp") / "s"))


def cfg(**kw):
  c = pipeline.default_data_config()
  c.update(dict(seq_len=1024, batch_size=2, num_epochs=1, num_packing_bins=2, seed=3))
  c.update(kw)
  return c


def _segments(b):
  """(tokens, weights) of every packed document in a batch, in order."""
  out = []
  for row in range(b["tokens"].shape[0]):
    seg = b["segment_ids"][row]
    for s in np.unique(seg[seg > 0]):
      m = seg == s
      pos = b["positions"][row][m]
      assert np.array_equal(pos, np.arange(m.sum()))  # positions restart at 0, contiguous
      out.append((b["tokens"][row][m], b["loss_weights"][row][m]))
    assert np.all(b["loss_weights"][row][seg == 0] == 0)
  return out


def _runs(ids, w):
  runs, cur = [], []
  for i, x in zip(ids, w):
    if x > 0:
      cur.append(int(i))
    elif cur:
      runs, cur = runs + [cur], []
  return runs + ([cur] if cur else [])


def test_cpt_packing_and_masked_observations(tok, trajs):
  it = pipeline.make_train_iterator(cfg(shuffle=False), tok, "cpt", source=trajs)
  batches = list(it)
  assert all(b["tokens"].shape == (2, 1024) and b["tokens"].dtype == np.int32 for b in batches)
  assert all(b["loss_weights"].dtype == np.float32 for b in batches)
  docs = [d for b in batches for d in _segments(b)]
  assert len(docs) == len(trajs) and it.stats["documents"] == len(trajs)
  by_text = {}
  for ids, w in docs:
    assert ids[0] == tok.im_start_id and w[0] == 0
    by_text[tok.decode(ids)] = [tok.decode(r) for r in _runs(ids, w)]
  for t in trajs:
    text = tok.chat_text(prompts.render_messages(t, None, 1))
    want = [x.observation + "<|im_end|>" for k, x in enumerate(t.turns)
            if masking.keep_turn(t.id, k, x.action, x.observation, 0)]
    # Loss only on the kept observations (not their header), masked turns in context; a token
    # holding the header's last newline and the observation's start counts as observation.
    assert [r[1:] if r[:1] == "\n" else r for r in by_text[text]] == want
  assert it.stats["loss_tokens"] == sum(int((b["loss_weights"] > 0).sum()) for b in batches)


def test_cpt_long_trajectory_split_into_documents(tok, trajs):
  t = max(trajs, key=lambda x: len(tok.encode_chat(prompts.render_messages(x, None, 1))))
  msgs = prompts.render_messages(t, None, 1)
  sys_ids = tok.encode_message(msgs[0])[0]
  pair = max(len(tok.encode_chat(msgs[i:i + 2])) for i in range(1, len(msgs), 2))
  budget = len(sys_ids) + pair + 2  # every turn fits alone, the whole trajectory does not
  samples = pipeline.cpt_samples(t, tok, cfg(seq_len=budget, loss_masking=False))
  assert len(samples) > 1 and all(len(s["tokens"]) <= budget for s in samples)
  assert sum(int(s["n_split"][0]) for s in samples) == len(samples) - 1
  got = []
  for s in samples:
    assert list(s["tokens"][:len(sys_ids)]) == sys_ids
    got += [tok.decode(r) for r in _runs(s["tokens"], s["loss_weights"])]
  # The observation header is boilerplate: only the observation itself is in the loss.
  assert got == [x.observation + "<|im_end|>" for x in t.turns]


def test_sft_target_and_thinking(tok, many):
  t = schema.Trajectory.from_dict({**many[0].to_dict(), "meta": {"think": ["a", "b", "c", "d"]}})
  k = pipeline.target_turn(t, 3)
  s = pipeline.sft_sample(t, tok, cfg())
  (run,) = _runs(s["tokens"], s["loss_weights"])
  assert tok.decode(run) == (f"<think>{'abcd'[k]}</think>\n<predicted_observation>"
                             f"{t.turns[k].observation}</predicted_observation><|im_end|>")
  v = prompts.variant_for("sft", t.id, 3)
  assert 2 <= v <= 11
  assert tok.decode(s["tokens"]) == tok.chat_text(
      prompts.render_messages(t, k, v, thinking=True, think="abcd"[k]))
  targets = collections.Counter(pipeline.target_turn(x, 3) for x in many)
  assert len(targets) > 1  # the seeded choice varies over trajectories


def test_sft_instruction_thinking_target_restates_the_instruction(tok, many):
  """thinking_target='instruction': the think block says the simulation-instruction section
  again word for word as the sample's template shows it (also when there is none), whatever
  meta["think"] holds."""
  words = "Pagination: a result never lists more than 3 items or rows."
  for instruction in (words, ""):
    t = schema.Trajectory.from_dict({**many[1].to_dict(), "simulation_instruction": instruction,
                                     "meta": {"think": ["x"] * len(many[1].turns)}})
    k, v = pipeline.target_turn(t, 3), prompts.variant_for("sft", t.id, 3)
    said = words if instruction else "None. Behave exactly like the real environment."
    assert said in prompts.system_prompt(t, v)
    s = pipeline.sft_sample(t, tok, cfg(thinking_target="instruction", seq_len=8192))
    (run,) = _runs(s["tokens"], s["loss_weights"])
    assert tok.decode(run) == (f"<think>Simulation instruction: {said}</think>\n"
                               f"<predicted_observation>{t.turns[k].observation}"
                               f"</predicted_observation><|im_end|>")
  assert prompts.instruction_think(t, 0) == "Simulation instruction: None."


def test_sft_history_loss_trains_every_kept_observation(tok, trajs):
  t = next(x for x in trajs if x.id == "term-001")
  k = pipeline.target_turn(t, 3)
  assert k >= 1  # the test needs history before the target
  plain = pipeline.sft_sample(t, tok, cfg(thinking=False, seq_len=8192))
  every = pipeline.sft_sample(t, tok, cfg(thinking=False, seq_len=8192, sft_history_loss=True))
  assert np.array_equal(plain["tokens"], every["tokens"])  # same sample, other weights
  header = "**Environment Observation:**\n"
  obs = lambda run: tok.decode(run)
  assert [obs(r) for r in _runs(plain["tokens"], plain["loss_weights"])] == [
      header + t.turns[k].observation + "<|im_end|>"]
  # Independent reference: every assistant reply of the rendered chat, target included.
  want = [header + x.observation + "<|im_end|>" for x in t.turns[:k + 1]]
  assert [obs(r) for r in _runs(every["tokens"], every["loss_weights"])] == want
  # history cut to fit: only the kept history's replies are weighted
  msgs = prompts.render_messages(t, k, prompts.variant_for("sft", t.id, 3), thinking=False)
  budget = len(tok.encode_chat(msgs)) - 1
  ids, w, drop, _ = pipeline._fit_history(tok, msgs, budget, 1.0, history_weight=1.0)
  assert drop >= 1
  assert [obs(r) for r in _runs(ids, w)] == want[drop:]
  with pytest.raises(ValueError, match="'sft_history_loss' needs the sft stage without thinking"):
    pipeline.make_train_iterator(cfg(thinking=True, sft_history_loss=True), tok, "sft",
                                 source=trajs)
  with pytest.raises(ValueError, match="'sft_history_loss' needs the sft stage"):
    pipeline.make_train_iterator(cfg(thinking=False, sft_history_loss=True), tok, "cpt",
                                 source=trajs)


def test_sft_overlong_drops_oldest_history(tok, trajs):
  t = next(x for x in trajs if x.id == "term-001")
  k = 3
  msgs = prompts.render_messages(t, k, 5, thinking=True)
  full = tok.encode_chat(msgs)
  last_pair = tok.encode_message(msgs[-2])[0] + tok.encode_message(msgs[-1])[0]
  budget = len(full) - 1
  ids, w, drop, cut = pipeline._fit_history(tok, msgs, budget, 1.0)
  assert drop >= 1 and cut == 0 and len(ids) <= budget
  kept = [msgs[0]] + msgs[1 + 2 * drop:]
  assert ids == tok.encode_chat(kept)  # system prompt + newest history + target
  assert ids[-len(last_pair):] == last_pair
  # a budget below system + target: history all gone, system shortened, target intact
  ids, w, drop, cut = pipeline._fit_history(tok, msgs, len(last_pair) + 20, 1.0)
  assert drop == k and cut == 1 and ids[-len(last_pair):] == last_pair


def test_resume_reproduces_next_10_batches(tok, many):
  for stage in ("cpt", "sft"):
    c = cfg(seq_len=512, num_epochs=-1, overlong="truncate_history")
    it = pipeline.make_train_iterator(c, tok, stage, source=many)
    for _ in range(3):
      next(it)
    state = json.loads(json.dumps(it.get_state()))  # the state survives JSON
    ref = [next(it) for _ in range(10)]
    it2 = pipeline.make_train_iterator(c, tok, stage, source=many)
    it2.set_state(state)
    got = [next(it2) for _ in range(10)]
    for a, b in zip(ref, got):
      assert a.keys() == b.keys()
      for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert it2.stats == it.stats


@pytest.mark.slow
def test_resume_with_worker_process(tok, many):
  c = cfg(seq_len=512, num_epochs=-1, worker_count=1, overlong="truncate_history")
  it = pipeline.make_train_iterator(c, tok, "sft", source=many)
  next(it)
  state = it.get_state()
  ref = [next(it) for _ in range(10)]
  it2 = pipeline.make_train_iterator(c, tok, "sft", source=many)
  it2.set_state(state)
  for a in ref:
    b = next(it2)
    for key in a:
      np.testing.assert_array_equal(a[key], b[key])
  plain = pipeline.make_train_iterator(cfg(seq_len=512, num_epochs=-1, overlong="truncate_history"),
                                       tok, "sft", source=many)
  next(plain)
  np.testing.assert_array_equal(next(plain)["tokens"], ref[0]["tokens"])  # same data either way


def test_two_processes_disjoint_and_complete(tok, many):
  seen = []
  for p in range(2):
    it = pipeline.make_train_iterator(cfg(batch_size=3), tok, "rl-prompts", p, 2, source=many)
    ids = [i for b in it for i in b["ids"]]
    assert len(ids) == len(set(ids))
    seen.append(set(ids))
  assert not seen[0] & seen[1]
  assert seen[0] | seen[1] == {t.id for t in many}


def test_epochs_reshuffle_and_repeat(tok, many):
  it = pipeline.make_train_iterator(cfg(batch_size=4, num_epochs=2), tok, "rl-prompts",
                                    source=many)
  ids = [i for b in it for i in b["ids"]]
  n = len(many)
  assert collections.Counter(ids) == collections.Counter(t.id for t in many for _ in range(2))
  assert ids[:n] != ids[n:]  # a fresh order in the second epoch


def test_rl_prompts_batch(tok, many):
  b = next(pipeline.make_train_iterator(cfg(batch_size=3), tok, "rl-prompts", source=many))
  assert b["tokens"].shape == (3, 1024) and b["lengths"].shape == (3,)
  by_id = {t.id: t for t in many}
  for i in range(3):
    t = by_id[b["ids"][i]]
    k = int(b["turns"][i])
    assert k == pipeline.target_turn(t, 3) and b["ground_truths"][i] == t.turns[k].observation
    assert b["domains"][i] == t.domain
    ids = list(b["tokens"][i, :b["lengths"][i]])
    assert ids == tok.encode_chat(prompts.prompt_messages(t, k, 0), add_generation_prompt=True)
    assert json.loads(b["prompts"][i]) == prompts.prompt_messages(t, k, 0)
    assert np.all(b["tokens"][i, b["lengths"][i]:] == tok.pad_id)


def test_tfds_build_and_pipeline(tmp_path, tok, trajs):
  res = tfds_trajectories.build([JSONL], str(tmp_path), split_fractions=(0.5, 0.25, 0.25))
  assert sum(res.split_sizes.values()) == len(trajs) == res.hygiene.kept
  ids = {}
  for split in res.split_sizes:
    src = tfds_trajectories.load_split(str(tmp_path), split)
    ids[split] = {src[i].id for i in range(len(src))}
  assert sum(len(v) for v in ids.values()) == len({i for v in ids.values() for i in v})
  ref = {t.id: t.to_dict() for t in trajs}
  src = tfds_trajectories.load_split(str(tmp_path), "train")
  assert all(src[i].to_dict() == ref[src[i].id] for i in range(len(src)))
  c = cfg(tfds_dir=str(tmp_path), split="train", batch_size=1)
  got = [i for b in pipeline.make_train_iterator(c, tok, "rl-prompts") for i in b["ids"]]
  assert set(got) == ids["train"]


def test_config_errors(tok, many):
  with pytest.raises(ValueError, match="seq_len"):
    pipeline.make_train_iterator(cfg(seq_len=0), tok, "cpt", source=many)
  with pytest.raises(ValueError, match="unknown stage"):
    pipeline.make_train_iterator(cfg(), tok, "pretrain", source=many)
  with pytest.raises(ValueError, match="jsonl"):
    pipeline.make_train_iterator(cfg(), tok, "cpt")
