"""`launch/serve.py` as a user runs it: a tiny Hugging Face folder with a SentencePiece tokenizer,
served with bfloat16 decode weights after its start-up warm-up (logged with its duration), answers
the `openai` client; a bad decode option is one error line and exit status 2."""
import os
import re
import subprocess
import sys
import time

import openai
import pytest
import requests
from flax import nnx

from lwm_jax import hf
from lwm_jax.data import tokenizer as tok_lib
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer
from lwm_jax.sampling.background import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVE = os.path.join(REPO, "launch", "serve.py")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  tmp_path = tmp_path_factory.mktemp("serve_cli")
  words = "ls cat grep error file directory denied output total bytes home root tmp log".split()
  texts = [" ".join(words[(i * 5 + j) % len(words)] for j in range(10)) for i in range(300)]
  ckpt = tmp_path / "tiny_hf"
  sp = tok_lib.train_sentencepiece(texts, 300, ckpt / "tokenizer")
  vocab = tok_lib.load_tokenizer(sp).vocab_size
  cfg = get_preset("tiny", vocab_size=-(-vocab // 64) * 64)
  hf.save_pretrained(Transformer(cfg, rngs=nnx.Rngs(0)), str(ckpt))
  return ckpt


@pytest.mark.slow
def test_serve_with_bfloat16_decode_weights(checkpoint):
  ckpt = checkpoint
  port = free_port()
  proc = subprocess.Popen([sys.executable, SERVE, f"--checkpoint={ckpt}", f"--port={port}",
                           "--decode_dtype=bfloat16", "--max_batch=4", "--warmup_prompt_len=16",
                           "--max_tokens=16", f"--compilation_cache={checkpoint}/jax_cache"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
  try:
    deadline = time.time() + 180
    while True:
      assert proc.poll() is None, proc.stdout.read()[-3000:]
      try:
        if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
          break
      except requests.ConnectionError:
        pass
      assert time.time() < deadline, "server did not come up"
      time.sleep(0.5)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
    assert [m.id for m in client.models.list().data] == ["tiny_hf"]
    r = client.chat.completions.create(
        model="tiny_hf", messages=[{"role": "user", "content": "ls /tmp"}], max_tokens=8,
        temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 8 and isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason == "length"
    # /health says when the background warm-up is still compiling; wait for it to finish.
    while "detail" in requests.get(f"http://127.0.0.1:{port}/health", timeout=5).json():
      assert time.time() < deadline + 180, "background warm-up did not finish"
      time.sleep(0.5)
  finally:
    proc.terminate()
    proc.wait(timeout=30)
  log = proc.stdout.read()
  # The continuous engine (the default): slot buckets of 1, 2 and 4 rows, prompts up to 16 tokens
  # (one prefill chunk), budgets 16 and the whole context (decode windows 64, 128, ..., 1024,
  # 1536, 2048: seven per slot bucket), and the prefill of 1, 2 and 4 prompts together, besides
  # one prompt's prefill in 512-token chunks over the whole cache; ready after that and the
  # largest window of one slot (which hold any lone request), the other twenty-three compiled
  # while serving.
  assert re.search(r"ready after [0-9.]+ s: 2 warm-up shapes compiled; 23 more in the background",
                   log), log[-3000:]
  assert re.search(r"warm-up finished after [0-9.]+ s \(25 shapes\)", log), log[-3000:]
  assert os.listdir(checkpoint / "jax_cache")  # compiled shapes kept for the next start


def test_serve_rejects_an_unknown_decode_dtype(checkpoint):
  ckpt = checkpoint
  proc = subprocess.run([sys.executable, SERVE, f"--checkpoint={ckpt}", "--decode_dtype=int3"],
                        capture_output=True, text=True, timeout=120, cwd=REPO)
  assert proc.returncode == 2
  assert "error: decode dtype 'int3' is not one of" in proc.stderr
