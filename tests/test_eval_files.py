"""Evaluation files never lose data: the predictions cache only appends, reading never writes,
foreign content is an error naming file and line, and the baselines' names are reserved."""
import json
import os

import pytest
from absl import app, flags

from lwm_jax.data import bench_records as awb
from lwm_jax.eval import inference as A
from lwm_jax.eval import report
from lwm_jax.sampling.backends import FunctionBackend
from lwm_jax.eval.runner import ForeignFileError, JsonlCache, read_rows

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_cli(*argv):
  """Runs the AgentWorldBench command line (evals/agentworldbench.py's) in this process, its flags
  parsed, then reset."""
  from lwm_jax.eval import agentworldbench_cli  # pylint: disable=import-outside-toplevel
  try:
    agentworldbench_cli.run(flags.FLAGS(["agentworldbench.py", *argv]))
  finally:
    flags.FLAGS.unparse_flags()


def _recs(n=3):
  return [awb.AWBRecord(task="terminal", id=f"r{i}", system_str="s", prompt=[f"a{i}"],
                        response=[f"o{i}"], current_prompt=f"a{i}", turn_idx=1, total_turns=1)
          for i in range(n)]


def _row(key, pred="p"):
  return json.dumps({"key": key, "task": "terminal", "id": key, "prediction": pred})


def test_complete_unparsable_last_line_is_an_error_not_removed(tmp_path):
  path = tmp_path / "p.jsonl"
  text = _row("terminal:r0") + "\n" + "this is my note\n"
  path.write_text(text)
  with pytest.raises(ForeignFileError, match=r"p\.jsonl:2: not a JSON row"):
    JsonlCache(path)
  with pytest.raises(ForeignFileError, match=r"p\.jsonl:2"):
    A.run_inference(_recs(), FunctionBackend(lambda m: "x"), str(path), progress=False)
  assert path.read_text() == text


def test_one_line_foreign_file_is_an_error_not_replaced(tmp_path):
  path = tmp_path / "notes.jsonl"
  path.write_text('{"note": "keep me"}')  # one line, no newline
  with pytest.raises(ForeignFileError, match=r"notes\.jsonl:1: row has no string 'key'"):
    JsonlCache(path)
  assert path.read_text() == '{"note": "keep me"}'


def test_append_after_a_last_line_without_newline_does_not_glue(tmp_path):
  path = tmp_path / "p.jsonl"
  path.write_text(_row("terminal:r0", "first"))  # a complete row, but no final newline
  stats = A.run_inference(_recs(), FunctionBackend(lambda m: "y"), str(path), progress=False)
  assert (stats.cached, stats.done) == (1, 2)
  text = path.read_text()
  assert text.startswith(_row("terminal:r0", "first") + "\n")
  rows = read_rows(path)  # on resume every row is there
  assert {k: r["prediction"] for k, r in rows.items()} == {
      "terminal:r0": "first", "terminal:r1": "y", "terminal:r2": "y"}


def test_torn_line_is_kept_ended_and_noted(tmp_path):
  path = tmp_path / "p.jsonl"
  before = _row("terminal:r0") + "\n" + '{"key": "terminal:r1", "predi'
  path.write_text(before)
  A.run_inference(_recs(), FunctionBackend(lambda m: "z"), str(path), progress=False)
  after = path.read_text()
  assert after.startswith(before + "\n")  # nothing removed, the torn line ended
  assert [json.loads(x) for x in open(str(path) + ".torn")] == [{"line": 2}]
  assert sorted(read_rows(path)) == ["terminal:r0", "terminal:r1", "terminal:r2"]
  # a middle line that was not noted as torn is foreign
  path.write_text(before + "\n" + _row("terminal:r2") + "\n")
  os.remove(str(path) + ".torn")
  with pytest.raises(ForeignFileError, match=r"p\.jsonl:2"):
    read_rows(path)


def test_score_never_modifies_files(tmp_path):
  recs = _recs()
  out = tmp_path / "run"
  A.write_baselines(recs, str(out))
  notes = out / "predictions" / "notes.jsonl"
  notes.write_text("remember to rerun with seed 1")  # a user's one-line note
  snapshot = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
  with pytest.raises(ForeignFileError, match=r"notes\.jsonl:1"):
    report.score_run(recs, str(out))
  # the note is an unterminated final line that does not start a JSON object: foreign, untouched
  assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == snapshot
  os.remove(notes)
  res = report.score_run(recs, str(out))
  assert list(res["systems"]) == ["copy_previous", "empty"]


def test_baseline_names_are_reserved(tmp_path):
  recs = _recs()
  with pytest.raises(ValueError, match="reserved for a baseline"):
    A.run_inference(recs, FunctionBackend(lambda m: "x", name="empty"),
                    str(tmp_path / "e.jsonl"), progress=False)
  assert not (tmp_path / "e.jsonl").exists()
  # a file in a baseline's place that is not the baseline is refused, not replaced
  mine = tmp_path / "run" / "predictions" / "copy_previous.jsonl"
  mine.parent.mkdir(parents=True)
  mine.write_text(_row("terminal:r0", "my model's answer") + "\n")
  with pytest.raises(ForeignFileError, match="reserved for the baseline"):
    A.write_baselines(recs, str(tmp_path / "run"))
  assert mine.read_text() == _row("terminal:r0", "my model's answer") + "\n"
  # the CLI refuses the name before touching anything
  bench = tmp_path / "bench"
  bench.mkdir()
  awb.write_awb_jsonl(bench / "terminal_test.jsonl", recs)
  out = tmp_path / "run2"
  (out / "predictions").mkdir(parents=True)
  (out / "predictions" / "empty.jsonl").write_text(_row("terminal:r0", "kept") + "\n")
  with pytest.raises(app.UsageError, match="reserved for a baseline"):
    run_cli("infer", f"--data={bench}", f"--out={out}", "--endpoint=http://127.0.0.1:9/v1",
            "--model=m", "--system=empty", "--noprogress")
  assert (out / "predictions" / "empty.jsonl").read_text() == _row("terminal:r0", "kept") + "\n"
  assert not (out / "predictions" / "copy_previous.jsonl").exists()
