"""evals/free_running.py: the free-running evaluation of any checkpoint beside the baselines."""
import json
import os
import shutil

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli():
  from lwm_jax.eval import free_running_cli
  return free_running_cli


def test_model_specs_are_parsed_and_bad_ones_named(tmp_path):
  cli = _cli()
  d = str(tmp_path)
  assert cli.parse_model(f"a={d}") == ("a", d, "sft")
  assert cli.parse_model(f"b={d}:cpt") == ("b", d, "cpt")
  with pytest.raises(SystemExit, match="NAME=DIR"):
    cli.parse_model(d)
  with pytest.raises(SystemExit, match="is not a folder"):
    cli.parse_model(f"c={d}/missing:sft")
  with pytest.raises(SystemExit, match="names must differ"):
    cli.main([f"--model=a={d}", f"--model=a={d}", f"--out={d}/o"])


@pytest.mark.slow
def test_a_tiny_checkpoint_beside_the_baselines(tmp_path):
  """A tiny random model on two turns of one terminal trajectory: every selected turn has a
  prediction row, and the copy-previous row equals the metric computed here."""
  from lwm_jax.data import schema
  from lwm_jax import textsim
  from test_eval_checkpoint_e2e import save_tiny_checkpoint_for, shortest_terminal_test_trajectory
  traj = shortest_terminal_test_trajectory()
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  schema.write_jsonl(str(corpus / "terminal_test.jsonl.gz"), [traj])
  ckpt = tmp_path / "tiny_hf"
  save_tiny_checkpoint_for(traj, ckpt, 4096)
  out = tmp_path / "out"
  _cli().main([f"--model=tiny={ckpt}", f"--corpus={corpus}", "--max_turns=2",
               "--max_new_tokens=4", "--batch=2", f"--out={out}"])
  res = json.load(open(out / "free_running.json"))
  rows = [json.loads(line) for line in open(out / "predictions" / "tiny.jsonl")]
  assert len(rows) == 2 and all(isinstance(r["prediction"], str) for r in rows)
  assert res["systems"]["tiny"]["generation"]["cases"] == 2
  by_turn = {t: x for t, x in enumerate(traj.turns)}
  want = sum(textsim.token_f1(by_turn[r["turn"] - 2].observation if r["turn"] > 1 else "",
                              r["truth"]) for r in rows) / 2
  got = res["systems"]["copy_previous"]["free"]["token_f1"]["overall"]
  assert got == pytest.approx(100.0 * want)
  assert res["models"]["tiny"] == {"folder": str(ckpt), "stage": "sft"}
  shutil.rmtree(out)


def test_split_flag_reads_the_named_split(tmp_path):
  """`--split=validation` reads the validation files, not the test ones: a corpus folder holding
  only a test file is refused with the missing split named."""
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  shutil.copy(os.path.join(REPO, "data", "corpus", "terminal_test.jsonl.gz"), corpus)
  with pytest.raises(SystemExit, match=r"_validation\.jsonl\.gz"):
    _cli().main([f"--model=a={tmp_path}", f"--corpus={corpus}", "--split=validation",
                 f"--out={tmp_path}/o"])
