"""Teacher-forced accuracy scores the observation body only (not its header, tags or end marker),
for the model and the copy-previous baseline alike; and the table says which worlds it covers."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lwm_jax.data import prompts, schema
from lwm_jax.data import tokenizer as tk
from lwm_jax.data.bench_records import OBSERVATION_HEADER, format_observation
from lwm_jax.eval import teacher_forced as tf

PREV_OBS = "total 3 files: alpha.txt beta.txt gamma.txt"
OBS = "total 2 files: alpha.txt delta.txt"


def _traj(tid="t1", world=None):
  return schema.Trajectory(
      id=tid, domain="terminal", task="list the files", action_space="bash commands",
      initial_state="$ ", turns=[schema.Turn("ls -l", PREV_OBS), schema.Turn("rm beta.txt", OBS)],
      meta={"world": world} if world else {})


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  texts = [prompts.system_prompt(_traj(), v) for v in range(4)]
  texts += [format_observation(PREV_OBS), format_observation(OBS), "ls -l", "rm beta.txt"] * 20
  path = tk.train_sentencepiece(texts, 400, tmp_path_factory.mktemp("sp") / "sp")
  return tk.load_tokenizer(path)


class Oracle:
  """A stand-in model: at position i it predicts `ids[i + 1]` where `right[i]` holds and a wrong
  id elsewhere, as one-hot logits over the vocabulary."""

  def __init__(self, ids, right, vocab):
    self.ids, self.right, self.vocab = list(ids), set(right), vocab

  def __call__(self, toks):
    n = toks.shape[1]
    pred = np.zeros(n, np.int32)
    for i in range(n):
      nxt = self.ids[i + 1] if i + 1 < len(self.ids) else 0
      pred[i] = nxt if i in self.right else (nxt + 1) % self.vocab
    # built from `toks` so that XLA computes the logits rather than folding a large constant
    pred_j = jnp.asarray(pred)[None] + 0 * toks
    return types.SimpleNamespace(logits=jax.nn.one_hot(pred_j, self.vocab))


def _chat_and_spans(tok, stage):
  """The chat ids the metric sees, computed here from whole messages, with the positions of the
  target message's header (or tags) tokens and of its body tokens."""
  traj = _traj()
  msgs = tf._render(traj, 1, stage.split("_")[0], 0, thinking=stage == "sft")
  ids = tok.encode_chat(msgs)
  last = tok.encode_message(msgs[-1])[0]
  start = len(ids) - len(last)
  head = len(tok.encode_message({"role": "assistant", "content": ""})[0]) - 2  # im_start, role
  content_ids = last[head:-2]            # without <|im_end|> and the newline after it
  body_ids = tok.encode(OBS)
  assert OBS in tok.decode(content_ids)
  if stage in ("cpt", "sft_nothink"):
    # precondition of this crafted example: the header tokenizes apart from the body
    assert content_ids == tok.encode(OBSERVATION_HEADER + "\n") + body_ids
    lo = len(content_ids) - len(body_ids)
  else:
    # thinking mode: `<think></think>\n<predicted_observation>` body `</predicted_observation>`
    lo = content_ids.index(tok.special_tokens["<predicted_observation>"]) + 1
    assert content_ids[lo:lo + len(body_ids)] == body_ids
  body = list(range(start + head + lo, start + head + lo + len(body_ids)))
  scaffold = [p for p in range(start + head, start + len(last) - 1) if p not in body]
  return ids, body, scaffold, body_ids


@pytest.mark.parametrize("stage", ["cpt", "sft", "sft_nothink"])
def test_header_tokens_are_not_scored(tok, stage):
  ids, body, scaffold, body_ids = _chat_and_spans(tok, stage)
  assert len(scaffold) >= 3 and body
  # right on every header/tag/end token and wrong on every body token: scores 0 (the header
  # used to be scored, so this model got credit for spelling `**Environment Observation:**`)
  kw = dict(stage=stage.split("_")[0], thinking=stage == "sft")
  acc = tf.observation_accuracy(Oracle(ids, [p - 1 for p in scaffold], tok.vocab_size), tok,
                                [_traj()], **kw)
  assert acc.samples == 1 and acc.tokens == len(body_ids) and acc.model == 0.0
  # the reply format is scored apart: in thinking mode every tag and the end marker, without
  # thinking the header the model writes and the end marker, in CPT (whose header carries no
  # loss and is written into its prompt) only the end marker
  fmt = scaffold if stage != "cpt" else [p for p in scaffold if ids[p] == tok.im_end_id]
  assert len(fmt) == (1 if stage == "cpt" else len(scaffold))
  assert acc.scaffold == 1.0 and acc.scaffold_tokens == len(fmt)
  assert acc.scaffold_prob == pytest.approx(1.0 / (1.0 + (tok.vocab_size - 1) / np.e))
  # right on the body only: a perfect score
  acc = tf.observation_accuracy(Oracle(ids, [p - 1 for p in body], tok.vocab_size), tok,
                                [_traj()], **kw)
  assert acc.model == 1.0 and acc.tokens == len(body_ids) and acc.scaffold == 0.0
  # the baseline copies the previous body over the same positions: hand count from the two bodies
  prev = tok.encode(PREV_OBS)
  expect = sum(1 for j, x in enumerate(body_ids) if j < len(prev) and prev[j] == x)
  assert 0 < expect < len(body_ids)
  assert acc.copy_previous == pytest.approx(expect / len(body_ids))
  assert acc.per_domain == {"terminal": (1.0, pytest.approx(expect / len(body_ids)),
                                         len(body_ids))}


def test_body_positions_match_the_cpt_loss(tok):
  # the scored positions are the CPT loss positions of that message minus its <|im_end|>
  msgs = tf._render(_traj(), 1, "cpt", 0)
  ids, body = tf.body_positions(tok, msgs, OBS, thinking=False)
  _, w = tok.encode_message(msgs[-1], 1.0, format_observation(""))
  start = len(ids) - len(w)
  weighted = [start + i for i, x in enumerate(w) if x > 0]
  assert ids[weighted[-1]] == tok.im_end_id and body == weighted[:-1]


def test_world_coverage_and_groups(tok):
  ids, body, _, _ = _chat_and_spans(tok, "cpt")
  evaluated = [_traj("a", "terminal-w1"), _traj("b", "terminal-w2"), _traj("c", "terminal-w2"),
               _traj("d")]
  train = [_traj("x", "terminal-w2"), _traj("y", "terminal-w9")]
  cov = tf.world_coverage(evaluated, train)
  assert (cov.trajectories, cov.worlds, cov.seen_in_train, cov.missing) == (4, 2, 1, 1)
  assert "1 of them also seen in training" in cov.describe()
  assert "none of them seen in training" in tf.world_coverage(evaluated[:1], train).describe()
  assert "cannot tell" in tf.world_coverage(evaluated[3:], train).describe()
  acc = tf.observation_accuracy(Oracle(ids, [p - 1 for p in body], tok.vocab_size), tok,
                                evaluated, stage="cpt", train_worlds={"terminal-w2", "terminal-w9"})
  n = len(body)
  assert {k: v[2] for k, v in acc.per_group.items()} == {tf.UNSEEN: n, tf.SEEN: 2 * n,
                                                          tf.NO_WORLD: n}
  assert tf.observation_accuracy(Oracle(ids, [], tok.vocab_size), tok, evaluated,
                                 stage="cpt").per_group == {}


def test_observation_nll_of_every_turn_and_history_dropped_to_fit(tok):
  ids, body, _, body_ids = _chat_and_spans(tok, "sft_nothink")
  oracle = Oracle(ids, [p - 1 for p in body], tok.vocab_size)
  recs, skipped = tf.observation_nll(oracle, tok, [_traj()], thinking=False, max_len=len(ids))
  assert skipped == 0 and [(r.traj, r.turn, r.dropped) for r in recs] == [(0, 0, 0), (0, 1, 0)]
  # one-hot logits: the right id has log-probability 1 - log(e + V - 1), every other one
  # 0 - log(e + V - 1); the oracle is right on every body token of turn 1
  right = 1.0 - np.log(np.e + tok.vocab_size - 1)
  last = recs[1]
  assert last.tokens == len(body_ids) and last.nll == pytest.approx(-right * len(body_ids), 1e-4)
  assert recs[0].tokens == len(tok.encode(PREV_OBS))
  # a context one token short: turn 1 loses the oldest (action, observation) pair to fit, and
  # its body keeps every token
  recs, skipped = tf.observation_nll(oracle, tok, [_traj()], thinking=False,
                                     max_len=len(ids) - 1)
  assert skipped == 0 and recs[1].dropped == 1 and recs[1].tokens == len(body_ids)
  # a context shorter than the system prompt: nothing fits, every turn is counted as skipped
  recs, skipped = tf.observation_nll(oracle, tok, [_traj()], thinking=False, max_len=16)
  assert recs == [] and skipped == 2


def test_observation_nll_reuses_a_pass_only_where_it_is_a_prefix(tok, monkeypatch):
  """Without thinking every turn's sample is a prefix of the last one's, so one pass serves all
  turns; in thinking mode the target is written differently from the history, so each turn gets
  its own pass. Either way each turn's figure equals a pass over that turn's sample alone."""
  import dataclasses
  traj = _traj()
  traj = dataclasses.replace(traj, turns=traj.turns + [schema.Turn("cat delta.txt", "delta: 4")])
  table = jax.random.normal(jax.random.PRNGKey(0), (tok.vocab_size, tok.vocab_size))
  model = lambda toks: types.SimpleNamespace(logits=table[toks])  # noqa: E731  (causal)
  real_scorer, passes = tf._scorer, []

  def counting(m):
    fwd = real_scorer(m)
    return lambda toks: (passes.append(1), fwd(toks))[1]

  monkeypatch.setattr(tf, "_scorer", counting)
  for thinking, expect in ((False, 1), (True, 3)):
    passes.clear()
    recs, _ = tf.observation_nll(model, tok, [traj], thinking=thinking, max_len=4096)
    assert [r.turn for r in recs] == [0, 1, 2] and len(passes) == expect
    for r in recs:  # the same turn as the last of a cut trajectory: always its own pass
      cut = dataclasses.replace(traj, turns=traj.turns[:r.turn + 1])
      alone = tf.observation_nll(model, tok, [cut], thinking=thinking, max_len=4096)[0][-1]
      assert (alone.turn, alone.tokens) == (r.turn, r.tokens)
      assert alone.nll == pytest.approx(r.nll, rel=1e-5)
