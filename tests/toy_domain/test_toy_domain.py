"""The acceptance test of "one home per domain": a toy eighth domain, defined only in this folder,
goes through collection, a corpus, a few CPT steps of a tiny model, the free-running evaluation
and the judge, with no file outside this folder naming it."""
import json
import os

import pytest

from lwm_jax import domains
from toy_domain import DOMAIN


@pytest.fixture
def toy():
  domains.register_domain(DOMAIN, replace=True)
  yield DOMAIN
  domains.unregister_domain(DOMAIN.name)


@pytest.mark.slow  # heavy (tens of seconds): `make test-slow`, which CI runs, keeps `make test` under 8 minutes
def test_a_toy_domain_needs_only_its_record(toy, tmp_path):
  from configs import stages
  from lwm_jax import judge as judge_lib
  from lwm_jax.data import bench_records, corpus as corpus_lib, prompts, schema
  from lwm_jax.envs import base, collect, verify, verify_transcript
  from lwm_jax.eval import free_running as F, judge as eval_judge, metrics, records as R
  from lwm_jax.sampling import Sampler
  from lwm_jax.sampling.backends import FunctionBackend
  from lwm_jax.train import trainer

  # the registry knows it, beside the seven built-in ones; it is not a benchmark domain
  assert "toy" in domains.names() and "toy" not in domains.bench_domains()
  assert len(domains.bench_domains()) == 7

  # collect: the real environment and scripted agent of the record, through the shared collector
  trajs, stats = collect.collect("toy", episodes=8, workers=1, progress=False)
  assert stats["kept"] == 8 and stats["worlds"] >= 2
  assert all(t.domain == "toy" and len(t.turns) == 4 for t in trajs)
  # both verifiers are the record's: the live state and the transcript agree
  env = base.make_env("toy")
  env.reset(int(trajs[0].meta["seed"]))
  for a in (t.action for t in trajs[0].turns):
    env.step(a)
  assert verify.check(env, trajs[0].turns).success
  assert all(verify_transcript.check_trajectory(t).success for t in trajs)

  # a corpus folder; the schema accepts the registered domain when reading it back
  folder = tmp_path / "corpus"
  folder.mkdir()
  for split, part in (("train", trajs[:6]), ("validation", trajs[6:7]), ("test", trajs[7:])):
    schema.write_jsonl(str(folder / f"toy_{split}.jsonl.gz"), part)
  corpus = corpus_lib.load_corpus(str(folder))
  assert len(corpus.train) == 6 and len(corpus.test) == 1
  system = prompts.system_prompt(corpus.test[0], 1)
  assert "a notebook of short notes kept under keys" in system

  # CPT: a few steps of a tiny model with a tokenizer trained on the corpus
  sp, _, vocab = corpus_lib.train_tokenizer(corpus.train, 400, str(tmp_path / "tok"))
  wd = str(tmp_path / "cpt")
  c = stages.stage_config("cpt", preset="tiny", vocab=vocab, steps=3, batch=2, seq_len=256,
                          workdir=wd, tokenizer=sp, train=corpus.train_jsonl,
                          valid=corpus.valid_jsonl)
  c.train.eval_batches = 1
  out = trainer.train(c, wd)
  assert len(out["losses"]) >= 1 and all(l == l for l in out["losses"])

  # free-running evaluation of the checkpoint beside the baselines, the table under "Toy"
  sampler = Sampler.from_checkpoint(wd)
  variant, prefix = F.prompting("cpt")
  sel = F.select_cases(corpus.test, max_turns=2, variant=variant)
  preds, gen = F.generate(sampler, sel.cases, max_new_tokens=4, batch_size=2, reply_prefix=prefix)
  res = F.results(sel, {"cpt": {k: v["prediction"] for k, v in preds.items()}}, {"cpt": gen},
                  train=corpus.train)
  assert res["domains"] == ["toy"] and "| Toy |" in F.markdown(res)

  # the judge: the record's guidance reaches the judge's system prompt; a fake judge scores
  test = corpus.test[0]
  recs = bench_records.trajectory_to_records(test, prompts.system_prompt(test, 0), [1, 2])
  seen = []

  def fake_judge(messages):
    seen.append(messages[0]["content"])
    return '```json\n{"format": 5, "factuality": 4, "consistency": 4, "realism": 4, ' \
           '"quality": 4, "reason": "ok"}\n```'

  predictions = {R.record_key(r): {"prediction": r.ground_truth} for r in recs}
  judged = tmp_path / "judged.jsonl"
  eval_judge.run_judging(recs, predictions, FunctionBackend(fake_judge), str(judged),
                         progress=False)
  assert seen and all(DOMAIN.judge_guidance in s for s in seen)
  assert seen[0] == judge_lib.judge_system_prompt("toy")
  rows = [json.loads(line) for line in open(judged)]
  agg = metrics.aggregate(rows)
  assert set(agg["domains"]) == {"toy"} and agg["partial"]  # no benchmark domain was scored
  assert os.path.isdir(wd)


def test_an_unregistered_domain_is_an_error_everywhere():
  from lwm_jax import judge as judge_lib
  from lwm_jax.data import schema
  from lwm_jax.envs import base
  domains.unregister_domain("toy")
  with pytest.raises(ValueError, match="unknown domain 'toy'"):
    judge_lib.judge_system_prompt("toy")
  with pytest.raises(ValueError, match="unknown domain 'toy'"):
    base.make_env("toy")
  with pytest.raises(schema.RecordError, match="unknown domain 'toy'"):
    schema.Trajectory.from_dict({"id": "x", "domain": "toy", "task": "", "action_space": "",
                                 "initial_state": "", "turns": [{"action": "a", "observation": "b"}]})


def test_a_record_without_judge_guidance_cannot_be_made():
  with pytest.raises(ValueError, match="judge_guidance"):
    domains.Domain(**{**{f: getattr(DOMAIN, f) for f in ("name", "display", "env", "agent", "prompt",
                                                       "guidance", "agent_world", "content")},
                      "judge_guidance": ""})
