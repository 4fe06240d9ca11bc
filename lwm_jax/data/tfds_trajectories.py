"""TFDS builder: trajectory JSONL files -> ArrayRecord splits with random access.

Each example is one trajectory: `id`, `domain`, `num_turns` and the full record as JSON text.
Splits are by trajectory: a hash of (id, split_seed) puts every trajectory in exactly one of
train / validation / test, so all turns of a trajectory stay in one split. No TensorFlow is
needed: tensorflow-datasets writes ArrayRecord files and reads them back with `as_data_source`.

    build(["a.jsonl", "b.jsonl.gz"], data_dir)              # once
    src = load_split(data_dir, "train")                       # len(src), src[i] -> Trajectory
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Sequence

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from lwm_jax.data import hygiene as hygiene_lib
from lwm_jax.data import importers, schema
from lwm_jax.data.schema import LoadReport, Trajectory

NAME = "lwm_trajectories"
SPLITS = ("train", "validation", "test")


def split_of(traj_id: str, fractions: Sequence[float], seed: int = 0) -> str:
  """The split a trajectory id belongs to, fixed by (id, seed); fractions sum to 1."""
  h = hashlib.blake2b(f"{seed}\x1fsplit\x1f{traj_id}".encode("utf-8"), digest_size=8).digest()
  u = int.from_bytes(h, "big") / 2.0**64
  acc = 0.0
  for name, f in zip(SPLITS, fractions):
    acc += f
    if u < acc:
      return name
  return SPLITS[len(fractions) - 1]


class LwmTrajectories(tfds.core.GeneratorBasedBuilder):
  """Trajectories of the seven LWM domains, one example per trajectory."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First version."}

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    # TFDS would locate this file through `importlib_resources` (not a dependency of ours).
    return epath.Path(__file__)

  def __init__(self, *, jsonl_paths: Sequence[str] = (), fmt: str = "auto", mode: str = "strict",
               quarantine_dir: str | None = None, apply_hygiene: bool = True,
               split_fractions: Sequence[float] = (0.9, 0.05, 0.05), split_seed: int = 0,
               **kwargs: Any):
    self._jsonl_paths = [os.fspath(p) for p in jsonl_paths]
    self._fmt, self._mode, self._quarantine_dir = fmt, mode, quarantine_dir
    self._apply_hygiene = apply_hygiene
    if len(split_fractions) != 3 or abs(sum(split_fractions) - 1.0) > 1e-6 or min(
        split_fractions) < 0:
      raise ValueError(f"split_fractions must be 3 non-negative numbers summing to 1, "
                       f"got {split_fractions}")
    self._fractions, self._split_seed = tuple(split_fractions), split_seed
    self.load_reports: list[LoadReport] = []
    self.hygiene_report = hygiene_lib.HygieneReport()
    kwargs.setdefault("file_format", "array_record")
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description="LWM trajectories: (action, observation) turns with their system-prompt parts.",
        features=tfds.features.FeaturesDict({
            "id": tfds.features.Text(),
            "domain": tfds.features.Text(),
            "num_turns": tfds.features.Scalar(dtype=np.int32),
            "json": tfds.features.Text(),
        }),
        homepage="https://github.com/QwenLM/Qwen-AgentWorld")

  def _load_all(self) -> dict[str, list[Trajectory]]:
    if not self._jsonl_paths:
      raise ValueError("LwmTrajectories needs jsonl_paths to build")
    by_split: dict[str, list[Trajectory]] = {s: [] for s in SPLITS}
    seen: dict[str, str] = {}
    for path in self._jsonl_paths:
      q = None
      if self._quarantine_dir and self._mode == "skip":
        os.makedirs(self._quarantine_dir, exist_ok=True)
        q = schema.quarantine_path(self._quarantine_dir, path)
      trajs, report = importers.load_any(path, self._fmt, self._mode, q)
      self.load_reports.append(report)
      if self._apply_hygiene:
        trajs = hygiene_lib.filter_trajectories(trajs, self.hygiene_report)
      for t in trajs:
        if t.id in seen:
          raise ValueError(f"{path}: trajectory id '{t.id}' also appears in {seen[t.id]}")
        seen[t.id] = path
        by_split[split_of(t.id, self._fractions, self._split_seed)].append(t)
    if not seen:
      loaded = sum(r.loaded for r in self.load_reports)
      bad = sum(r.num_bad for r in self.load_reports)
      raise ValueError(
          f"nothing to build from {', '.join(self._jsonl_paths)}: {loaded} records loaded, {bad} "
          f"bad, hygiene: {self.hygiene_report.summary()}")
    return by_split

  def _split_generators(self, dl_manager: Any) -> dict[str, Any]:
    by_split = self._load_all()
    return {s: self._generate_examples(by_split[s]) for s in SPLITS
            if by_split[s] or s == "train"}

  def _generate_examples(self, trajs: list[Trajectory]):
    for t in trajs:
      yield t.id, {"id": t.id, "domain": t.domain, "num_turns": len(t.turns),
                   "json": json.dumps(t.to_dict(), ensure_ascii=False)}


@dataclasses.dataclass
class BuildResult:
  data_dir: str
  split_sizes: dict[str, int]
  load_reports: list[LoadReport]
  hygiene: hygiene_lib.HygieneReport


def build(jsonl_paths: Sequence[str], data_dir: str, **kwargs: Any) -> BuildResult:
  """Builds (or rebuilds) the ArrayRecord dataset under `data_dir/lwm_trajectories/1.0.0`."""
  builder = LwmTrajectories(jsonl_paths=jsonl_paths, data_dir=data_dir, **kwargs)
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(
          download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS))
  sizes = {name: int(info.num_examples) for name, info in builder.info.splits.items()}
  return BuildResult(os.fspath(builder.data_dir), sizes, builder.load_reports,
                     builder.hygiene_report)


def dataset_dir(data_dir: str) -> str:
  """The versioned folder of a built dataset: `data_dir` itself or data_dir/lwm_trajectories/v."""
  if os.path.isfile(os.path.join(data_dir, "dataset_info.json")):
    return data_dir
  root = os.path.join(data_dir, NAME)
  if not os.path.isdir(root):
    raise FileNotFoundError(f"no built {NAME} dataset under {data_dir} (run `launch/data.py build`)")
  versions = sorted(v for v in os.listdir(root) if os.path.isfile(
      os.path.join(root, v, "dataset_info.json")))
  if not versions:
    raise FileNotFoundError(f"{root} holds no finished version")
  return os.path.join(root, versions[-1])


class TrajectorySource:
  """Random access to one split: `len(src)`, `src[i]` -> Trajectory (picklable for workers)."""

  def __init__(self, data_dir: str, split: str):
    self.data_dir, self.split = dataset_dir(data_dir), split
    self._source = None
    self._len = len(self._open())

  def _open(self):
    if self._source is None:
      builder = tfds.builder_from_directory(self.data_dir)
      if split_name(self.split) not in builder.info.splits:
        raise ValueError(f"{self.data_dir}: no split '{self.split}' "
                         f"(have {', '.join(builder.info.splits)})")
      self._source = builder.as_data_source(split=self.split)
    return self._source

  def __len__(self) -> int:
    return self._len

  def __getitem__(self, i: int) -> Trajectory:
    rec = self._open()[int(i)]
    text = rec["json"]
    return Trajectory.from_dict(json.loads(text.decode("utf-8") if isinstance(text, bytes) else text))

  def __getstate__(self) -> dict[str, Any]:
    return {"data_dir": self.data_dir, "split": self.split, "_len": self._len, "_source": None}

  def __setstate__(self, state: dict[str, Any]) -> None:
    self.__dict__.update(state)


def split_name(split: str) -> str:
  return split.split("[")[0]


def load_split(data_dir: str, split: str = "train") -> TrajectorySource:
  return TrajectorySource(data_dir, split)
