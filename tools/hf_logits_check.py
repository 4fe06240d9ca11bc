"""A shipped folder in Hugging Face transformers against lwm_jax, on the longest bundled prompt.

Two environments, because torch stays out of ours: the first step (our venv) renders the longest
AgentWorldBench prompt of `evals/mini_bench` with our chat template, runs our model on it and
writes the ids, the messages and our logits of the last `--positions` positions; the second
(a venv with torch and transformers, `pip install -e .[hf]` or just torch + transformers) loads the
folder with AutoTokenizer and AutoModelForCausalLM, checks that `apply_chat_template` gives the
same ids, runs the model on them and prints the largest logit difference.

  python tools/hf_logits_check.py ours --folder=data/world_model_long --work=/tmp/parity
  TORCH_VENV/bin/python tools/hf_logits_check.py hf --folder=data/world_model_long --work=/tmp/parity
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ours(folder: str, work: str, positions: int) -> None:
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from lwm_jax import hf  # pylint: disable=import-outside-toplevel
  from lwm_jax.data import tokenizer as tok_lib  # pylint: disable=import-outside-toplevel
  from lwm_jax.eval import records  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling.chat_template import chatml_ids  # pylint: disable=import-outside-toplevel
  tok = tok_lib.load_tokenizer(folder)
  best = None
  for rec in records.load_bench(os.path.join(REPO, "evals", "mini_bench")):
    msgs = records.chat_messages(rec)
    ids = chatml_ids(tok, msgs)
    if best is None or len(ids) > len(best[1]):
      best = (records.record_key(rec), ids, msgs)
  key, ids, msgs = best
  model = hf.load_pretrained(folder, dtype="float32")
  if len(ids) > model.cfg.max_position_embeddings:
    raise SystemExit(f"{folder}: the longest prompt ({len(ids)} tokens, {key}) is longer than its "
                     f"context ({model.cfg.max_position_embeddings})")
  logits = np.asarray(model(jnp.asarray([ids])).logits[0, -positions:], np.float32)
  os.makedirs(work, exist_ok=True)
  np.save(os.path.join(work, "ids.npy"), np.asarray(ids, np.int64))
  np.save(os.path.join(work, "logits_ours.npy"), logits)
  with open(os.path.join(work, "messages.json"), "w", encoding="utf-8") as f:
    json.dump({"record": str(key), "messages": msgs}, f)
  print(f"record {key}: {len(ids)} prompt tokens; our logits of the last {positions} positions "
        f"written to {work}")


def hf_side(folder: str, work: str) -> None:
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  ids = np.load(os.path.join(work, "ids.npy")).tolist()
  with open(os.path.join(work, "messages.json"), encoding="utf-8") as f:
    msgs = json.load(f)["messages"]
  tok = transformers.AutoTokenizer.from_pretrained(folder)
  got = tok.apply_chat_template(msgs, add_generation_prompt=True)
  got = got if isinstance(got, list) else got["input_ids"]
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
  model.eval()
  ours_logits = np.load(os.path.join(work, "logits_ours.npy"))
  with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0, -len(ours_logits):].float().numpy()
  diff = float(np.max(np.abs(logits - ours_logits)))
  same_argmax = float(np.mean(logits.argmax(-1) == ours_logits.argmax(-1)))
  print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                    "class": type(model).__name__, "prompt_tokens": len(ids),
                    "chat_template_ids_equal": got == ids,
                    "max_abs_logit_diff": diff, "argmax_agreement": same_argmax,
                    "positions": int(len(ours_logits))}, indent=1))
  if got != ids or diff > 1e-3:
    sys.exit(1)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("side", choices=("ours", "hf"))
  ap.add_argument("--folder", required=True)
  ap.add_argument("--work", required=True)
  ap.add_argument("--positions", type=int, default=512)
  a = ap.parse_args()
  if a.side == "ours":
    ours(a.folder, a.work, a.positions)
  else:
    hf_side(a.folder, a.work)


if __name__ == "__main__":
  main()
