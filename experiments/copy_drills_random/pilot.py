"""Pilot: do drills of random text written twice (which only copying can predict) teach the
`demo` model to copy from its context within a CPT budget?

  python experiments/copy_drills_random/pilot.py ARM STEPS [SHARE]
    ARM: rand (random-piece drills), base (knowledge text alone), obs (observation drills, the
         earlier pilot's kind)

A random drill is 30-200 pieces drawn uniformly from the tokenizer's ordinary pieces, decoded
to text and written twice, separated by a blank line. The drill documents join the knowledge
text (full loss) at SHARE of the CPT tokens (default 0.3). Checkpoints every 100 steps are kept
for probe.py. Writes runs/copy_drills_random/ARM.
"""
import os, sys, json, random, time, shutil
from lwm_jax.data import corpus as corpus_lib
from configs import stages
from lwm_jax.data import documents
from lwm_jax.data.documents import Document
from lwm_jax.data.tokenizer import load_tokenizer
from lwm_jax.envs import knowledge
from lwm_jax.train import run_config as rc, sources as src, trainer

TOKENIZER = "data/world_model/tokenizer.model"


def random_drills(n: int, seed: int = 0) -> list[Document]:
  tok = load_tokenizer(TOKENIZER)
  pieces = {i: tok.decode([i]) for i in range(tok.vocab_size)}
  ids = [i for i, p in pieces.items()
         if p.strip() and not any(ch in p for ch in "<>\ufffd")]
  rng = random.Random(seed)
  out = []
  for i in range(n):
    text = tok.decode([rng.choice(ids) for _ in range(rng.randint(30, 200))])
    out.append(Document(f"drill/rand/{i}", text + "\n\n" + text, ""))
  return out


def obs_drills(corpus, n: int, seed: int = 0) -> list[Document]:
  rng = random.Random(seed)
  obs = [t.observation for tr in corpus.train for t in tr.turns if len(t.observation) > 200]
  out = []
  for i in range(n):
    o = rng.choice(obs)
    k = rng.randint(300, 900)
    a = rng.randint(0, max(0, len(o) - k))
    out.append(Document(f"drill/obs/{i}", o[a:a + k] + "\n\n" + o[a:a + k], ""))
  return out


if __name__ == "__main__":
  arm, steps = sys.argv[1], int(sys.argv[2])
  share = float(sys.argv[3]) if len(sys.argv) > 3 else 0.3
  wd = f"runs/copy_drills_random/{arm}"
  shutil.rmtree(wd, ignore_errors=True); os.makedirs(wd)
  corpus = corpus_lib.load_corpus("data/corpus")
  docs = knowledge.knowledge_documents()
  if arm == "rand":
    docs += random_drills(6000)
  elif arm == "obs":
    docs += obs_drills(corpus, 3000)
  else:
    share = 0.1
  kj = os.path.join(wd, "knowledge.jsonl.gz")
  documents.write_documents(docs, kj)
  c = stages.stage_config("cpt", preset="demo", vocab=2048, steps=steps, batch=4, seq_len=2048,
                          workdir=wd, tokenizer=TOKENIZER, train=corpus.train_jsonl,
                          valid=corpus.valid_jsonl, export_hf=True, knowledge_jsonl=kj,
                          knowledge_share=share)
  c.checkpoint.every, c.checkpoint.keep = 100, 20
  source, evals, _ = src.pipeline_source(c, rc.validate_config(c), c.stage)
  t0 = time.time()
  summary = trainer.train(c, os.path.join(wd, "cpt"), source=source, eval_source=evals)
  shutil.copy(TOKENIZER, os.path.join(wd, "hf"))
  print(json.dumps({"arm": arm, "share": share, "eval": summary.get("eval"),
                    "loss_last": summary["losses"][-1], "s": time.time() - t0}, default=str))
