"""The evaluation report says which worlds its records cover and whether training saw them."""
from lwm_jax.data import bench_records, schema
from lwm_jax.eval import report


def _records(tid, domain, world):
  traj = schema.Trajectory(id=tid, domain=domain, task="t", action_space="a", initial_state="s",
                           turns=[schema.Turn("a1", "o1"), schema.Turn("a2", "o2")])
  recs = bench_records.trajectory_to_records(traj, "sys", [0, 1])
  for r in recs:
    if world:
      r.extra["world"] = world
  return recs


def test_report_counts_worlds(tmp_path):
  recs = (_records("a", "terminal", "terminal-w1") + _records("b", "terminal", "terminal-w1")
          + _records("c", "terminal", "terminal-w2") + _records("d", "web", "web-w1")
          + _records("e", "web", None))
  # the world field survives the file round trip (it is how make_corpus hands it on)
  path = tmp_path / "bench.jsonl"
  bench_records.write_awb_jsonl(str(path), recs)
  recs = list(bench_records.read_awb_jsonl(str(path)))
  cov = report.world_coverage(recs)
  assert cov == {"worlds": {"terminal": 2, "web": 1}, "total": 3, "records_without_world": 2,
                 "seen_in_train": None}
  line = report.coverage_line(cov)
  assert "3 distinct (Term. 2, Web 1)" in line and "not checked" in line and "2 records" in line
  seen = report.world_coverage(recs, {"terminal-w2", "other"})
  assert seen["seen_in_train"] == 1 and "1 of them seen in training" in report.coverage_line(seen)
  assert "none of them seen" in report.coverage_line(report.world_coverage(recs, set()))
  res = report.score_run(recs, str(tmp_path / "run"), train_worlds=set())
  assert res["worlds"]["seen_in_train"] == 0
  assert "Worlds: 3 distinct" in report.markdown_report(res)
  assert "carry no world id" in report.coverage_line(report.world_coverage(_records("f", "os",
                                                                                     None)))


def test_benchmark_scores_carry_the_kinds_of_turn_from_recorded_facts(tmp_path):
  """Records made from a recorded trajectory carry the environment's facts of the turn under
  test through the file; the score report's by-kind tables read them (counted by hand)."""
  import json
  from lwm_jax.eval import inference, records as R
  missing = "cat: x: No such file or directory\n"
  traj = schema.Trajectory(id="t", domain="terminal", task="t", action_space="a",
                           initial_state="s", turns=[
                               schema.Turn("cat x", missing, {"error": "exit status 1",
                                                              "changed": False}),
                               schema.Turn("touch y", "", {"error": "", "changed": True}),
                               schema.Turn("ls", "y\n")])
  path = tmp_path / "terminal_test.jsonl"
  bench_records.write_awb_jsonl(str(path), bench_records.trajectory_to_records(traj, "sys",
                                                                                [0, 1, 2]))
  recs = list(bench_records.read_awb_jsonl(str(path)))
  assert [r.extra.get(bench_records.ENV_KEY) for r in recs] == [t.env for t in traj.turns]
  run = tmp_path / "run"
  inference.write_baselines(recs, str(run))
  preds = [missing, "bash: y: Permission denied\n", "y\n"]
  with open(inference.predictions_path(str(run), "model"), "w") as f:
    for r, p in zip(recs, preds):
      f.write(json.dumps({"key": R.record_key(r), "task": "terminal", "id": r.id,
                          "prediction": p}) + "\n")
  res = report.score_run(recs, str(run))
  k = res["systems"]["model"]["kinds"]["terminal"]
  assert (k["turns"], k["error_turns"], k["errors"], k["errors_predicted"], k["errors_found"]) == (
      3, 2, 1, 2, 1)
  assert (k["changing_turns"], k["read_only_turns"]) == (1, 1)
  copy = res["systems"]["copy_previous"]["kinds"]["terminal"]
  assert (copy["errors_predicted"], copy["errors_found"]) == (1, 0)  # repeats the error after it
  md = report.markdown_report(res)
  assert "| model | 100.0 / 50.0 (1/2) |" in md and "| copy_previous | 0.0 / 0.0 (1/2) |" in md
