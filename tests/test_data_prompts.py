"""System prompt variants, stage assignment and chat rendering."""
import os

import pytest

from lwm_jax.data import prompts, schema
from lwm_jax.data.bench_records import format_action, format_observation

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "data")


@pytest.fixture(scope="module")
def trajs():
  return list(schema.read_jsonl(os.path.join(FIX, "trajectories.jsonl")))


def test_twelve_variants_per_domain_distinct_and_growing(trajs):
  by_domain = {t.domain: t for t in trajs}
  assert set(by_domain) == set(schema.DOMAINS)
  for t in by_domain.values():
    texts = [prompts.system_prompt(t, v) for v in range(12)]
    assert len(set(texts)) == 12
    assert len(texts[0]) < len(texts[2]) < len(texts[6]) < len(texts[11])
    for s in texts:  # all five parts are present
      assert t.task in s and t.initial_state.strip() in s and t.action_space.strip() in s
    assert "<think>" in texts[0] and "<think>" not in texts[1]  # CPT template is non-thinking
  with pytest.raises(ValueError):
    prompts.system_prompt(trajs[0], 12)


def test_dynamic_fields_and_override(trajs):
  t = trajs[0]
  assert "300 MB left" in prompts.system_prompt(t, 7)
  t2 = schema.Trajectory.from_dict({**t.to_dict(), "meta": {"system_str": "VERBATIM"}})
  assert prompts.system_prompt(t2, 5) == "VERBATIM"


def test_variant_for():
  assert prompts.variant_for("rl", "a", 0) == 0 and prompts.variant_for("cpt", "a", 0) == 1
  vs = [prompts.variant_for("sft", f"id{i}", 3) for i in range(500)]
  assert set(vs) == set(range(2, 12))
  assert vs == [prompts.variant_for("sft", f"id{i}", 3) for i in range(500)]
  assert vs != [prompts.variant_for("sft", f"id{i}", 4) for i in range(500)]
  with pytest.raises(ValueError):
    prompts.variant_for("pretrain", "a", 0)


def test_render_messages(trajs):
  t = trajs[0]
  full = prompts.render_messages(t, None, 1)
  assert [m["role"] for m in full] == ["system"] + ["user", "assistant"] * len(t.turns)
  assert full[3]["content"] == "### Turn 2\n**Action:**\n```\nls -S | head -3\n```"
  assert full[4]["content"] == "**Environment Observation:**\ndata.bin\nmodel.ckpt\nREADME.md"
  m = prompts.render_messages(t, 1, 3, thinking=True, think="two files")
  assert len(m) == 5 and m[3]["content"] == format_action(2, t.turns[1].action)
  assert m[4]["content"] == ("<think>two files</think>\n<predicted_observation>data.bin\n"
                             "model.ckpt\nREADME.md</predicted_observation>")
  assert m[2]["content"] == format_observation(t.turns[0].observation)
  p = prompts.prompt_messages(t, 1, 0)
  assert p == prompts.render_messages(t, 1, 0)[:-1] and p[-1]["role"] == "user"
  with pytest.raises(ValueError, match="out of range"):
    prompts.render_messages(t, 9, 0)
