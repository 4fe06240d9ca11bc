"""Pilot: does a share of repetition drills in CPT teach the `demo` model to copy from its context?

  python experiments/copy_drills_pilot/pilot.py drill 150   # CPT with drills, then probe.py
  python experiments/copy_drills_pilot/pilot.py base 150    # the same CPT without them

A drill is a random 300-900-character span of a training-split observation written twice. The
drill arm mixes 3,000 of them with the usual knowledge text at 30% of CPT tokens (the base arm:
the knowledge text alone at 10%). Run from the repository root; writes runs/copy_drills_pilot/ARM.
"""
import os, sys, json, random, time, shutil
from lwm_jax.data import corpus as corpus_lib
from configs import stages
from lwm_jax.data import documents
from lwm_jax.data.documents import Document
from lwm_jax.envs import knowledge
from lwm_jax.train import run_config as rc, sources as src, trainer

arm, steps = sys.argv[1], int(sys.argv[2])
wd = f"runs/copy_drills_pilot/{arm}"
shutil.rmtree(wd, ignore_errors=True); os.makedirs(wd)
corpus = corpus_lib.load_corpus("data/corpus")
docs = knowledge.knowledge_documents()
share = 0.1
if arm.startswith("drill"):
  rng = random.Random(0)
  obs = [t.observation for tr in corpus.train for t in tr.turns if len(t.observation) > 200]
  for i in range(3000):
    o = rng.choice(obs)
    n = rng.randint(300, 900)
    a = rng.randint(0, max(0, len(o) - n))
    piece = o[a:a + n]
    docs.append(Document(f"drill/{i}", piece + "\n\n" + piece, ""))
  share = 0.3
kj = os.path.join(wd, "knowledge.jsonl.gz")
documents.write_documents(docs, kj)
c = stages.stage_config("cpt", preset="demo", vocab=2048, steps=steps, batch=4, seq_len=2048,
                        workdir=wd, tokenizer="data/world_model/tokenizer.model",
                        train=corpus.train_jsonl, valid=corpus.valid_jsonl, export_hf=True,
                        knowledge_jsonl=kj, knowledge_share=share)
source, evals, _ = src.pipeline_source(c, rc.validate_config(c), c.stage)
t0 = time.time()
summary = trainer.train(c, os.path.join(wd, "cpt"), source=source, eval_source=evals)
shutil.copy("data/world_model/tokenizer.model", os.path.join(wd, "hf"))  # for probe.py
print(json.dumps({"arm": arm, "eval": summary.get("eval"), "loss_last": summary["losses"][-1],
                  "s": time.time() - t0}, default=str))
