"""Free-running evaluation on a crafted case: every metric and baseline worked out by hand, the
turn cap, batching by prompt length, history cuts and the report files."""
import json
import os
import types

import pytest

from lwm_jax.data.bench_records import format_action, format_observation
from lwm_jax.data.schema import Trajectory, Turn
from lwm_jax.eval import free_running as F


def _traj(tid, domain, world, turns):
  return Trajectory(id=tid, domain=domain, task="t", action_space="a", initial_state="s",
                    turns=[Turn(a, o) for a, o in turns], meta={"world": world})


TERM = _traj("term-1", "terminal", "w1", [("ls", "x y"), ("cat f", "x y"), ("wc f", "3 x")])
MCP = _traj("mcp-1", "mcp", "w2", [("call a", "ok"), ("call b", "ok")])
# What the fake model answers to each action (by the last user message), and how it stopped.
REPLIES = {
    "ls": (format_observation("x y"), "stop"),           # header removed: exact
    "cat f": ("x", "length"),                             # cut at the token cap
    "wc f": ("3 x", "stop"),
    "call a": ("", "stop"),
    "call b": ("<think>same as before</think><predicted_observation>ok</predicted_observation>",
               "stop"),
}


class FakeSampler:
  """Stands in for `Sampler`: a prompt is one token per character; replies come from REPLIES."""

  def __init__(self, context=100_000):
    self.engine = types.SimpleNamespace(context=context)
    self.batches = []

  def encode_prompt(self, msgs):
    return [0] * sum(len(m["content"]) for m in msgs)

  def generate(self, chats, params):
    assert params.temperature == 0.0
    self.batches.append([len(self.encode_prompt(c)) for c in chats])
    out = []
    for c in chats:
      text, why = REPLIES[ACTIONS[c[-1]["content"]]]
      out.append(types.SimpleNamespace(text=text, finish_reason=why))
    return out


# the user message of each action, as the prompt renders it -> the action
ACTIONS = {format_action(i + 1, t.action): t.action for tr in (TERM, MCP)
           for i, t in enumerate(tr.turns)}


def test_hand_computed_metrics_and_baselines(tmp_path):
  sel = F.select_cases([TERM, MCP])
  assert [c.key for c in sel.cases] == ["mcp:mcp-1:1", "mcp:mcp-1:2", "terminal:term-1:1",
                                        "terminal:term-1:2", "terminal:term-1:3"]
  # the model sees the true history: turn 3 carries the two real observations before it
  last = sel.cases[-1].messages
  assert last[0]["role"] == "system" and last[-1]["content"] == format_action(3, "wc f")
  assert [m["content"] for m in last[2:5:2]] == [format_observation("x y")] * 2
  sampler = FakeSampler()
  preds, stats = F.generate(sampler, sel.cases, max_new_tokens=16, batch_size=2)
  assert {k: v["prediction"] for k, v in preds.items()} == {
      "mcp:mcp-1:1": "", "mcp:mcp-1:2": "ok", "terminal:term-1:1": "x y",
      "terminal:term-1:2": "x", "terminal:term-1:3": "3 x"}
  # batched across turns, each batch sorted by prompt length
  assert [len(b) for b in sampler.batches] == [2, 2, 1] and stats.batches == 3
  flat = [n for b in sampler.batches for n in b]
  assert flat == sorted(flat)
  assert stats.cut_at_max_new_tokens == 1 and stats.unanswered == 0 and stats.history_cut == 0

  res = F.results(sel, {"model": {k: v["prediction"] for k, v in preds.items()}},
                  {"model": stats}, train=[_traj("tr", "terminal", "w1", [("a", "b")])])
  s = res["systems"]
  assert list(s) == ["model", "copy_previous", "empty"]
  want = {  # percent (exact, token F1, edit similarity) per domain, worked out by hand:
      # terminal model: "x y"=="x y" (1, 1, 1); "x" vs "x y": F1 2/3 (P 1, R 1/2), edit 1 - 2/3;
      # "3 x" exact (1, 1, 1). mcp model: '' vs "ok" (0, 0, 0); parsed "ok" exact (1, 1, 1)
      "model": {"terminal": (200 / 3, 800 / 9, 700 / 9), "mcp": (50, 50, 50)},
      # terminal copy-previous: '' vs "x y" (0, 0, 0); "x y" vs "x y" (1, 1, 1);
      # "x y" vs "3 x": F1 1/2, edit distance 2 of 3 -> 1/3
      "copy_previous": {"terminal": (100 / 3, 50, 400 / 9), "mcp": (50, 50, 50)},
      "empty": {"terminal": (0, 0, 0), "mcp": (0, 0, 0)},
  }
  for name, doms in want.items():
    for d, (ex, f1, ed) in doms.items():
      got = tuple(s[name]["free"][m]["domains"][d] for m in ("exact", "token_f1", "edit_sim"))
      assert got == pytest.approx((ex, f1, ed)), (name, d)
  assert s["model"]["free"]["token_f1"]["overall"] == pytest.approx((800 / 9 + 50) / 2)
  v = F.versus(res, "model")
  assert v["margin"] == pytest.approx({"mcp": 0.0, "terminal": 800 / 9 - 50})
  assert v["ahead"] == ["terminal"] and v["domains"] == 2
  assert res["worlds"]["worlds"] == 2 and res["worlds"]["seen_in_train"] == 1

  paths = F.write_report(res, str(tmp_path))
  md = open(paths["markdown"]).read()
  assert "| model | 50.00 | 88.89 | **69.44** |" in md          # token F1 row (MCP, Term.)
  assert "| model | +0.00 | +38.89 | **+19.44** | 1 of 2 |" in md
  assert "Worlds: 2 distinct among 2 trajectories, 1 of them also seen in training" in md
  assert "1 (cap 16)" in md
  assert os.path.getsize(paths["png_token_f1"]) > 1000
  assert json.load(open(paths["json"]))["systems"]["empty"]["free"]["exact"]["overall"] == 0
  F.write_predictions(sel.cases, preds, str(tmp_path / "p.jsonl"))
  rows = [json.loads(x) for x in open(tmp_path / "p.jsonl")]
  assert rows[1]["raw"].startswith("<think>") and rows[1]["prediction"] == "ok"


def test_turn_cap_is_seeded_counted_and_reported():
  sel = F.select_cases([TERM, MCP], max_turns=2, seed=1)
  assert sel.turns_total == {"mcp": 2, "terminal": 3}
  assert sel.turns_selected == {"mcp": 2, "terminal": 2}
  assert "Term. 2 of 3" in sel.describe() and "at most 2 per domain" in sel.describe()
  assert [c.key for c in sel.cases] == [c.key for c in F.select_cases([TERM, MCP], 2, 1).cases]
  with pytest.raises(ValueError, match="max_turns"):
    F.select_cases([TERM], max_turns=0)


def test_long_prompts_lose_oldest_history_or_go_unanswered():
  sel = F.select_cases([TERM])
  full = [len(FakeSampler().encode_prompt(c.messages)) for c in sel.cases]
  # one token short for the third turn's prompt: it loses its oldest history turn, nothing else
  sampler = FakeSampler(context=full[2] - 1 + 16)
  preds, stats = F.generate(sampler, sel.cases, max_new_tokens=16)
  assert stats.history_cut == 1 and stats.history_turns_dropped == 1
  assert preds["terminal:term-1:3"]["history_dropped"] == 1
  first_pair = sum(len(m["content"]) for m in sel.cases[2].messages[1:3])
  assert sorted(sampler.batches[0]) == sorted([full[0], full[1], full[2] - first_pair])
  # room for the first prompt only: the later actions ("cat f", "wc f") are longer than "ls", so
  # even without history their prompts do not fit: unanswered, scored as empty
  preds, stats = F.generate(FakeSampler(context=full[0] + 16), sel.cases, max_new_tokens=16)
  assert stats.unanswered == 2 and preds["terminal:term-1:2"]["prediction"] == ""


def test_reply_prefix_is_written_before_generation_and_kept_in_the_raw_reply():
  """A CPT model is prompted in its own template with the observation header already written
  (`prompting`); the sampler gets the chat's ids followed by the header's ids."""
  class PrefixSampler(FakeSampler):
    tokenizer = types.SimpleNamespace(encode_content=lambda role, text: [9] * len(text))

    def generate(self, prompts, params):
      self.batches.append(prompts)
      return [types.SimpleNamespace(text="3 x", finish_reason="stop") for _ in prompts]

  assert F.prompting("sft") == (F.EVAL_VARIANT, "")
  variant, header = F.prompting("cpt")
  assert variant == 1 and header == format_observation("")
  sel = F.select_cases([TERM], variant=variant)
  assert sel.cases[0].messages[0] != F.select_cases([TERM]).cases[0].messages[0]
  sampler = PrefixSampler(context=10_000)
  preds, _ = F.generate(sampler, sel.cases, max_new_tokens=16, reply_prefix=header)
  for ids, c in zip(sampler.batches[0], sorted(sel.cases, key=lambda c: len(
      sampler.encode_prompt(c.messages)))):
    assert ids == sampler.encode_prompt(c.messages) + [9] * len(header)
  raw = preds["terminal:term-1:3"]
  assert raw["raw"] == header + "3 x" and raw["prediction"] == "3 x"


def test_the_simulators_loop_guard_is_scored_beside_the_greedy_replies():
  """With a loop guard, the greedy prediction stays and `guarded` is what the guarded simulator
  would show: a loop cut to one copy of its unit, or drawn again (at a temperature)."""
  loop = "x y" + " y" * 12

  class Looping(FakeSampler):
    def generate(self, chats, params):
      self.batches.append(params)
      if isinstance(params, list):  # the guard's redraw, at a temperature
        assert all(p.temperature > 0 for p in params)
        return [types.SimpleNamespace(text="x y", finish_reason="stop") for _ in chats]
      return [types.SimpleNamespace(text=loop if ACTIONS[c[-1]["content"]] == "cat f" else "3 x",
                                    finish_reason="length") for c in chats]

  sel = F.select_cases([TERM])
  preds, stats = F.generate(Looping(), sel.cases, max_new_tokens=16, loop_guard="cut")
  got = preds["terminal:term-1:2"]
  assert got["prediction"] == loop and got["guarded"] == "x y"
  assert got["loop_guard"] == {"looped": True, "resamples": 0, "cut": True}
  assert preds["terminal:term-1:1"]["guarded"] == "3 x"
  assert (stats.looped, stats.loop_resamples, stats.loops_cut) == (1, 0, 1)
  sampler = Looping()
  preds, stats = F.generate(sampler, sel.cases, max_new_tokens=16, loop_guard="resample")
  assert preds["terminal:term-1:2"]["guarded"] == "x y"
  assert (stats.looped, stats.loop_resamples, stats.loops_cut) == (1, 1, 0)
  assert len(sampler.batches) == 2 and sampler.batches[1][0].temperature > 0
  with pytest.raises(ValueError, match="loop_guard"):
    F.generate(Looping(), sel.cases, loop_guard="maybe")


def test_the_report_says_what_the_loop_guard_did():
  sel = F.select_cases([TERM])
  gen = F.GenerationStats(cases=3, loop_guard="resample", looped=2, loop_resamples=3, loops_cut=1,
                          max_new_tokens=16)
  preds = {c.key: "x" for c in sel.cases}
  res = F.results(sel, {"m": preds, "m+resample": preds}, {"m": gen})
  assert ("m+resample: the simulator's loop guard on the same replies: 2 of 3 greedy replies "
          "were loops; 3 drawn again, 1 cut.") in F.markdown(res)
