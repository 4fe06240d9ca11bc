"""The induction drill (launch/copy_drill.py): its rows, its phases and one end-to-end run on a
tiny model, whose output folder loads and continues."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from lwm_jax import hf
from lwm_jax.data import drills
from lwm_jax.data.drills import induction_rows
from tests.test_eval_checkpoint_e2e import save_tiny_checkpoint_for, shortest_terminal_test_trajectory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_rows_write_each_segment_twice():
  toks, second = induction_rows(np.random.default_rng(1), 6, 64, 50, (2, 8))
  assert toks.shape == second.shape == (6, 64)
  assert toks.min() >= 3 and toks.max() < 53
  for r in range(6):
    # walk the row: a segment of k ids, then the same k ids (marked), until the row ends
    i = 0
    while i < 64:
      k = 1
      while i + k < 64 and not second[r, i + k]:
        k += 1
      end = min(i + 2 * k, 64)
      assert toks[r, i + k:end].tolist() == toks[r, i:i + end - (i + k)].tolist()
      assert second[r, i + k:end].all() and not second[r, i:i + k].any()
      i = end
  again, _ = induction_rows(np.random.default_rng(1), 6, 64, 50, (2, 8))
  assert np.array_equal(toks, again)


@pytest.mark.parametrize("bad", ["64", "64:0", "100:10", "4:10", "a:b"])
def test_bad_phases_are_named(bad):
  with pytest.raises(SystemExit, match=f"--phases: '{bad}'"):
    drills.parse_phases(bad)


@pytest.mark.slow  # half a minute: `make test-slow`
def test_drill_end_to_end(tmp_path):
  start = tmp_path / "start"  # a tiny random model with its SentencePiece tokenizer.model
  save_tiny_checkpoint_for(shortest_terminal_test_trajectory(), start, 64)
  out = tmp_path / "out"
  run = subprocess.run([sys.executable, os.path.join(REPO, "launch", "copy_drill.py"),
                        f"--start={start}", f"--out={out}", "--phases=16:3,32:2", "--every=2", "--train=attention"],
                       capture_output=True, text=True, cwd=REPO, timeout=300)
  assert run.returncode == 0, run.stderr[-2000:]
  recs = [json.loads(x) for x in (out / "drill.jsonl").read_text().splitlines()]
  # scored at every second step and each phase's last (the trainer's checkpoints)
  assert [(r["row"], r["step"]) for r in recs] == [(16, 2), (16, 3), (32, 2)]
  assert all(np.isfinite([r["first"], r["second"], r["train_loss"]]).all() for r in recs)
  prov = json.loads((out / "provenance.json").read_text())
  assert prov["drill"]["phases"] == [[16, 3], [32, 2]] and prov["drill"]["last_score"] == recs[-1]
  assert prov["drill_from"] == {"folder": str(start), "provenance": None}
  assert (out / "tokenizer.model").read_bytes() == (start / "tokenizer.model").read_bytes()
  before, after = hf.load_pretrained(str(start)), hf.load_pretrained(str(out))
  a, b = nnx.state(before, nnx.Param), nnx.state(after, nnx.Param)
  # --train=attention: the attention weights moved, nothing else did
  for (path, x), y in zip(jax.tree_util.tree_flatten_with_path(a)[0], jax.tree.leaves(b)):
    assert np.allclose(x, y) != ("self_attn" in jax.tree_util.keystr(path)), path
