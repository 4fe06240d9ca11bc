"""AgentWorldBench end to end with a real (tiny) model: a Hugging Face folder written by
`save_pretrained` with a SentencePiece tokenizer, served by our Sampler through the CLI's
--checkpoint path, judged by a fixed-JSON judge over HTTP, then scored."""
import json
import os
import subprocess
import sys

import pytest
from flax import nnx

from lwm_jax import hf
from lwm_jax.data import bench_records as awb
from lwm_jax.data import prompts, schema
from lwm_jax.data import tokenizer as tok_lib
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer

from test_eval_e2e import MISS_REPLY, _Server

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shortest_terminal_test_trajectory() -> schema.Trajectory:
  trajs = list(schema.read_jsonl(os.path.join(REPO, "data", "corpus", "terminal_test.jsonl.gz")))
  return min(trajs, key=lambda t: sum(len(x.observation) for x in t.turns))


def save_tiny_checkpoint_for(traj: schema.Trajectory, ckpt, context: int):
  """A Hugging Face folder at `ckpt`: the tiny random model with a 400-piece SentencePiece
  tokenizer trained on `traj`'s text and `context` positions."""
  texts = [prompts.system_prompt(traj, 0)] + [x.action + "\n" + x.observation for x in traj.turns]
  sp = tok_lib.train_sentencepiece(texts * 3, 400, ckpt / "tokenizer")
  vocab = tok_lib.load_tokenizer(sp).vocab_size
  cfg = get_preset("tiny", vocab_size=-(-vocab // 64) * 64, max_position_embeddings=context)
  hf.save_pretrained(Transformer(cfg, rngs=nnx.Rngs(0)), str(ckpt))


@pytest.mark.slow
def test_cli_with_a_tiny_checkpoint(tmp_path):
  traj = shortest_terminal_test_trajectory()
  ckpt = tmp_path / "tiny_hf"
  save_tiny_checkpoint_for(traj, ckpt, 8192)
  bench = tmp_path / "bench"
  bench.mkdir()
  awb.write_awb_jsonl(bench / "terminal_test.jsonl",
                      awb.trajectory_to_records(traj, prompts.system_prompt(traj, 0), [0, 1, 2]))
  judge = _Server(lambda body: (200, MISS_REPLY))
  out = tmp_path / "run"
  try:
    cmd = [sys.executable, os.path.join(REPO, "evals", "agentworldbench.py"), "all",
           f"--data={bench}", f"--out={out}", f"--checkpoint={ckpt}", "--system=tiny",
           "--max_tokens=12", "--temperature=0", f"--judge_endpoint={judge.url}",
           "--judge_model=fixed", "--noprogress"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
  finally:
    judge.close()
  preds = [json.loads(line) for line in open(next((out / "predictions").glob("tiny*.jsonl")))]
  assert len(preds) == 3 and all(not p.get("error") for p in preds)
  assert all(isinstance(p["prediction"], str) for p in preds)
  res = json.load(open(out / "scores.json"))["systems"]["tiny"]
  # The fixed judge scores (format 4, factuality 2, consistency 3, realism 4; quality invalid):
  # sample mean 3.25 -> (3.25 - 1) / 4 * 100 = 56.25 for every non-empty prediction.
  j = res["judge"]
  assert j["counts"]["terminal"] + j["excluded"]["terminal"] == 3
  if j["counts"]["terminal"]:
    assert abs(j["domains"]["terminal"] - 56.25) < 1e-6
