"""Weight interpolation between the shipped 2,048-token world model and a model continued on
4,608-token rows from it (issue 66 point 2): does a point on the line between them keep the
shipped model's copying and F1 while reading whole histories?

    python experiments/long_context/soup.py --short=data/world_model \
        --long=runs/world_model_4608 --alpha=0.5 --out=runs/soup_long4608_05

writes an HF folder whose every tensor is (1 - alpha) * short + alpha * long (both must share
names and shapes: the long one was trained from the short one), with the long one's config (its
context) and tokenizer files, fresh checksums and a provenance naming both starts and their
sha256; then plays the demo's episode and the 25 held-out terminal episodes with it.
"""
import argparse
import hashlib
import json
import os
import shutil
import sys

import numpy as np
from safetensors.numpy import load_file, save_file

from lwm_jax import hf


def sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def interpolate(short: str, long: str, alpha: float, out: str) -> dict:
  a = load_file(os.path.join(short, "model.safetensors"))
  b = load_file(os.path.join(long, "model.safetensors"))
  if a.keys() != b.keys():
    raise SystemExit(f"{short} and {long} hold different tensors: "
                     f"{sorted(a.keys() ^ b.keys())[:5]}")
  for k in a:
    if a[k].shape != b[k].shape:
      raise SystemExit(f"tensor {k}: {a[k].shape} in {short}, {b[k].shape} in {long}")
  mixed = {k: ((1.0 - alpha) * a[k].astype(np.float32) + alpha * b[k].astype(np.float32))
           .astype(a[k].dtype) for k in a}
  os.makedirs(out, exist_ok=True)
  for name in os.listdir(long):
    if name not in ("model.safetensors", "checksums.json", "provenance.json"):
      src = os.path.join(long, name)
      if os.path.isfile(src):
        shutil.copy(src, os.path.join(out, name))
  save_file(mixed, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(long, "provenance.json")) as f:
    long_prov = json.load(f)
  prov = {"model": long_prov.get("model"), "settings": long_prov.get("settings", {}),
          "made_by": " ".join(["python"] + sys.argv),
          "interpolation": {"alpha": alpha,
                            "short": {"path": short,
                                      "sha256": sha256(os.path.join(short, "model.safetensors"))},
                            "long": {"path": long,
                                     "sha256": sha256(os.path.join(long, "model.safetensors"))}}}
  with open(os.path.join(out, "provenance.json"), "w") as f:
    json.dump(prov, f, indent=1)
  hf.write_checksums(out)
  return prov


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--short", default="data/world_model")
  p.add_argument("--long", required=True)
  p.add_argument("--alpha", type=float, required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--corpus", default="data/corpus")
  p.add_argument("--skip_episodes", action="store_true")
  args = p.parse_args()
  prov = interpolate(args.short, args.long, args.alpha, args.out)
  print(json.dumps(prov["interpolation"]), flush=True)
  print("model.safetensors sha256", sha256(os.path.join(args.out, "model.safetensors")))
  if args.skip_episodes:
    return
  from lwm_jax.data import corpus as corpus_lib  # pylint: disable=import-outside-toplevel
  from lwm_jax.eval import episodes as episodes_lib  # pylint: disable=import-outside-toplevel
  from lwm_jax.sampling import Sampler  # pylint: disable=import-outside-toplevel
  corpus = corpus_lib.load_corpus(args.corpus)
  sim = episodes_lib.simulated_terminal_episodes(Sampler.from_checkpoint(args.out), corpus.test,
                                                 max_new_tokens=320)
  summary = sim["all_terminal_test_episodes"]
  print("SUMMARY demo", round(sim["mean_edit_similarity"], 4), "episodes", round(summary["mean"], 4),
        round(summary["median"], 4), summary["at_least_0.6"])


if __name__ == "__main__":
  main()
