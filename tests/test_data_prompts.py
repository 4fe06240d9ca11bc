"""System prompt variants, stage assignment and chat rendering."""
import os

import pytest

from lwm_jax import domains
from lwm_jax.data import prompts, schema
from lwm_jax.data.bench_records import format_action, format_observation

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "data")


@pytest.fixture(scope="module")
def trajs():
  return list(schema.read_jsonl(os.path.join(FIX, "trajectories.jsonl")))


def test_twelve_variants_per_domain_distinct_and_growing(trajs):
  by_domain = {t.domain: t for t in trajs}
  assert set(by_domain) == set(domains.bench_domains())
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


def _corpus_like(trajs):
  """Three episodes per domain under fresh ids and tasks (a small training pool)."""
  out = []
  for r in range(3):
    for t in trajs:
      d = t.to_dict()
      out.append(schema.Trajectory.from_dict({**d, "id": f"{t.id}-e{r}",
                                              "task": f"{t.task} (episode {r})"}))
  return out


def test_long_forms_grow_with_guidance_and_examples(trajs):
  from lwm_jax.data import demos
  pool_src = _corpus_like(trajs)
  pool = demos.DemoPool.from_trajectories(pool_src)
  assert [prompts.max_demos(v) for v in range(12)] == [0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 4, 4]
  for t in {x.domain: x for x in pool_src}.values():
    lines = lambda v: prompts.system_prompt(
        t, v, long=True, demos=pool.pick(t, prompts.max_demos(v))).count("\n") + 1
    for v in (0, 1):  # RL and CPT templates have no long form
      assert prompts.system_prompt(t, v, long=True) == prompts.system_prompt(t, v)
    plain = [prompts.system_prompt(t, v).count("\n") + 1 for v in range(12)]
    long = [lines(v) for v in range(12)]
    assert all(long[v] > plain[v] for v in range(2, 12)), t.domain
    assert long[2] < long[6] < long[11] and long[11] >= 2 * plain[11], (t.domain, long, plain)
    text = prompts.system_prompt(t, 11, long=True, demos=pool.pick(t, 4))
    assert "Simulation guidance" in text or "simulation_guidance" in text
    assert text.count("Episode task:") == len(pool.pick(t, 4)) >= 2
    assert text.rstrip().endswith("</output_format>")  # v11 is XML; the format section stays last
  with pytest.raises(ValueError, match="at most 1 worked"):
    prompts.system_prompt(trajs[0], 2, long=True, demos=["a", "b"])


def test_examples_come_from_other_trajectories_of_the_domain(trajs):
  from lwm_jax.data import demos
  pool_src = _corpus_like(trajs)
  pool = demos.DemoPool.from_trajectories(pool_src)
  for t in pool_src:
    picked = pool.pick(t, 4, seed=1)
    own = [x for x in pool_src if x.domain == t.domain and x.id != t.id]
    assert len(picked) == min(4, len(pool.examples[t.domain]) - (
        t.id in {i for i, _ in pool.examples[t.domain]}))
    for text in picked:  # each example is another episode of the same domain, never this one
      task = text.splitlines()[0][len("Episode task: "):]
      assert task != t.task and task in {x.task.splitlines()[0] for x in own}
  # The pool depends on the ids only, not on the order of the source.
  again = demos.DemoPool.from_trajectories(list(reversed(pool_src)))
  assert again.examples == pool.examples


def test_sft_samples_use_long_forms_only_when_they_fit(tmp_path_factory, trajs):
  from lwm_jax.data import hygiene, pipeline
  from lwm_jax.data import tokenizer as tk
  src = hygiene.filter_trajectories(_corpus_like(trajs))
  texts = [x.action for t in src for x in t.turns] + [x.observation for t in src for x in t.turns]
  texts += [prompts.system_prompt(t, v, long=True) for t in src[:8] for v in range(12)]
  tok = tk.load_tokenizer(tk.train_sentencepiece(texts, 600, tmp_path_factory.mktemp("sp") / "s"))
  cfg = pipeline.default_data_config()
  cfg.update(dict(seed=3, seq_len=8192))
  pool = pipeline.demo_pool(cfg, src)
  for t in src[:10]:
    k = pipeline.target_turn(t, 3)
    v = prompts.variant_for("sft", t.id, 3)
    msgs = pipeline.sft_messages(t, k, v, tok, cfg, pool)
    # A generous budget: the full long form with every worked example it takes.
    assert msgs[0]["content"] == prompts.system_prompt(
        t, v, long=True, demos=pool.pick(t, prompts.max_demos(v), 3))
    n = len(tok.encode_chat(msgs))
    plain = prompts.render_messages(t, k, v, thinking=True)
    n_plain = len(tok.encode_chat(plain))
    assert n > n_plain
    # A budget between the two: fewer examples (or none, or the plain variant), and it fits.
    cfg.seq_len = (n + n_plain) // 2
    fitted = pipeline.sft_messages(t, k, v, tok, cfg, pool)
    assert n_plain <= len(tok.encode_chat(fitted)) <= cfg.seq_len
    assert fitted == pipeline.sft_messages(t, k, v, tok, cfg, pool)  # deterministic
    cfg.seq_len = n_plain  # exactly the plain sample: the plain variant
    assert pipeline.sft_messages(t, k, v, tok, cfg, pool) == plain
    cfg.seq_len = 8192
