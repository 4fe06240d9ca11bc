"""Per-host reading of a built dataset: N simulated processes (process_index, process_count), each
reading only its own positions of one global order, with checkpointable iterators."""
import collections
import json
import os

import pytest

from lwm_jax.data import pipeline, prompts, schema, tfds_trajectories
from lwm_jax.data import tokenizer as tk

FIXTURE = os.path.join(os.path.dirname(__file__), "fixtures", "data", "trajectories.jsonl")
GLOBAL_BATCH = 8


class Recording(tfds_trajectories.TrajectorySource):
  """A TrajectorySource that notes every index it reads."""

  def __init__(self, data_dir, split):
    super().__init__(data_dir, split)
    self.read = []

  def __getitem__(self, i):
    self.read.append(int(i))
    return super().__getitem__(i)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  d = tmp_path_factory.mktemp("per_host")
  base = list(schema.read_jsonl(FIXTURE))
  trajs = [schema.Trajectory.from_dict({**t.to_dict(), "id": f"{t.id}-r{r}"})
           for r in range(9) for t in base]  # 72 = 9 global batches of 8
  path = str(d / "many.jsonl")
  schema.write_jsonl(path, trajs)
  res = tfds_trajectories.build([path], str(d / "tfds"), build_path="stream",
                                split_fractions=(1.0, 0.0, 0.0))
  texts = [x for t in trajs for turn in t.turns for x in (turn.action, turn.observation)]
  texts += [prompts.system_prompt(t, v) for t in base for v in range(12)]
  tok = tk.load_tokenizer(tk.train_sentencepiece(texts, 600, str(d / "sp")))
  return str(d / "tfds"), res.split_sizes["train"], tok


def _cfg(n, epochs=1):
  c = pipeline.default_data_config()
  c.update(dict(seq_len=4096, batch_size=GLOBAL_BATCH // n, num_epochs=epochs, seed=5))
  return c


def _run(data_dir, tok, n, epochs=1):
  """Per process: (its batches of ids, the source indices it read)."""
  out = []
  for p in range(n):
    src = Recording(data_dir, "train")
    it = pipeline.make_train_iterator(_cfg(n, epochs), tok, "rl-prompts", p, n, source=src)
    out.append(([list(b["ids"]) for b in it], src.read))
  return out


def test_each_host_reads_only_its_shard_and_every_record_once(built):
  data_dir, size, tok = built
  assert size == 72
  ref = None
  for n in (1, 2, 4):
    runs = _run(data_dir, tok, n)
    reads = [set(r) for _, r in runs]
    assert sum(len(r) for _, r in runs) == size          # no index read twice
    assert set().union(*reads) == set(range(size))       # every record read
    assert all(not (reads[i] & reads[j]) for i in range(n) for j in range(i + 1, n))
    ids = collections.Counter(i for batches, _ in runs for b in batches for i in b)
    assert len(ids) == size and set(ids.values()) == {1}  # every record exactly once
    steps = {len(b) for b, _ in runs}
    assert steps == {size // GLOBAL_BATCH}
    global_batches = [sorted(i for batches, _ in runs for i in batches[t])
                      for t in range(size // GLOBAL_BATCH)]
    if ref is None:
      ref = global_batches
    assert global_batches == ref                         # the same global batch for any N


def test_two_epochs_cover_every_record_twice_across_hosts(built):
  data_dir, size, tok = built
  runs = _run(data_dir, tok, 2, epochs=2)
  ids = collections.Counter(i for batches, _ in runs for b in batches for i in b)
  assert len(ids) == size and set(ids.values()) == {2}


def test_host_iterator_resumes_from_its_checkpoint(built):
  data_dir, _, tok = built
  src = tfds_trajectories.load_split(data_dir, "train")
  it = pipeline.make_train_iterator(_cfg(4, -1), tok, "rl-prompts", 3, 4, source=src)
  for _ in range(5):
    next(it)
  state = json.loads(json.dumps(it.get_state()))
  ref = [list(next(it)["ids"]) for _ in range(6)]
  it2 = pipeline.make_train_iterator(_cfg(4, -1), tok, "rl-prompts", 3, 4, source=src)
  it2.set_state(state)
  assert [list(next(it2)["ids"]) for _ in range(6)] == ref
