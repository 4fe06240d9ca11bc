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
from lwm_jax.data import corpus_build, importers, splits
from lwm_jax.data.schema import LoadReport, Trajectory

NAME = "lwm_trajectories"
SPLITS = ("train", "validation", "test")
BUILD_PATHS = ("memory", "stream", "beam")


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
  """Trajectories of the seven LWM domains, one example per trajectory.

  `build_path` picks how the corpus-wide steps run (the result is the same, see `corpus_build`):
  'memory' holds every trajectory at once (the original builder), 'stream' streams the inputs in
  bounded memory; `LwmTrajectoriesBeam` runs them as a Beam pipeline.
  """

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
               split_by: str = "id", dedup: bool = False, build_path: str = "memory",
               work_dir: str | None = None, shard_bytes: int = corpus_build.DEFAULT_SHARD_BYTES,
               **kwargs: Any):
    self._jsonl_paths = [os.fspath(p) for p in jsonl_paths]
    self._cfg = corpus_build.BuildConfig(
        fmt=fmt, mode=mode, quarantine_dir=quarantine_dir, apply_hygiene=apply_hygiene,
        split_by=split_by, fractions=tuple(float(f) for f in split_fractions),
        split_seed=split_seed, dedup=dedup)
    if build_path not in BUILD_PATHS:
      raise ValueError(f"build_path must be one of {', '.join(BUILD_PATHS)}, got '{build_path}'")
    self._build_path, self._work_dir, self._shard_bytes = build_path, work_dir, shard_bytes
    self.load_reports: list[LoadReport] = []
    self.hygiene_report = hygiene_lib.HygieneReport()
    self.manifest: dict[str, Any] | None = None
    self._stream: corpus_build.StreamingBuild | None = None
    self._memory_manifest: tuple | None = None
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
    cfg = self._cfg
    by_split: dict[str, list[Trajectory]] = {s: [] for s in SPLITS}
    seen: dict[str, str] = {}
    dups = hygiene_lib.DuplicateFilter() if cfg.dedup else None
    for path in self._jsonl_paths:
      q = cfg.quarantine_for(path)
      if q is not None:
        os.makedirs(cfg.quarantine_dir, exist_ok=True)
      trajs, report = importers.load_any(path, cfg.fmt, cfg.mode, q)
      self.load_reports.append(report)
      if cfg.apply_hygiene:
        trajs = hygiene_lib.filter_trajectories(trajs, self.hygiene_report)
      for t in trajs:
        if t.id in seen:
          raise ValueError(f"{path}: trajectory id '{t.id}' also appears in {seen[t.id]}")
        seen[t.id] = path
        split = cfg.split_for(t, path)
        if dups is not None and not dups.admit(t, corpus_build.dedup_world(t), split):
          continue
        by_split[split].append(t)
    if not seen:
      loaded = sum(r.loaded for r in self.load_reports)
      bad = sum(r.num_bad for r in self.load_reports)
      raise ValueError(
          f"nothing to build from {', '.join(self._jsonl_paths)}: {loaded} records loaded, {bad} "
          f"bad, hygiene: {self.hygiene_report.summary()}")
    tally = corpus_build.empty_tally()
    worlds = {}
    for s, trajs in by_split.items():
      for t in trajs:
        w = splits.world_of(t)
        corpus_build.tally_add(tally, s, t.domain, len(t.turns), w is not None)
      worlds[s] = len({splits.world_of(t) for t in trajs} - {None})
    self._memory_manifest = (dict(dups.report.dropped) if dups else {}, tally, worlds)
    return by_split

  def _split_generators(self, dl_manager: Any) -> dict[str, Any]:
    if self._build_path == "stream":
      self._stream = corpus_build.StreamingBuild(self._jsonl_paths, self._cfg, self._work_dir,
                                                 self._shard_bytes)
      self._stream.prepare()
      return {s: self._stream.examples(s) for s in SPLITS
              if self._stream.split_sizes[s] or s == "train"}
    by_split = self._load_all()
    return {s: self._generate_examples(by_split[s]) for s in SPLITS
            if by_split[s] or s == "train"}

  def _generate_examples(self, trajs: list[Trajectory]):
    for t in trajs:
      yield t.id, {"id": t.id, "domain": t.domain, "num_turns": len(t.turns),
                   "json": json.dumps(t.to_dict(), ensure_ascii=False)}

  def _finish(self) -> dict[str, Any]:
    """The build's MANIFEST (and load/hygiene reports) once every split is written."""
    if self._stream is not None:
      self.manifest = self._stream.manifest()
      self.load_reports = corpus_build.load_reports(self._stream.summary)
      self.hygiene_report = corpus_build.hygiene_report(self._stream.summary)
    else:
      dups, tally, worlds = self._memory_manifest
      summary = corpus_build.summary_of(self.load_reports, self.hygiene_report)
      self.manifest = corpus_build.manifest(self._cfg, summary, dups, tally, worlds)
    return self.manifest

  def _cleanup(self) -> None:
    if self._stream is not None:
      self._stream.close()


class LwmTrajectoriesBeam(LwmTrajectories, skip_registration=True):
  """The same builder on Apache Beam (`build_path='beam'`; needs the `.[beam]` extra): the
  pipeline TFDS hands to `_split_generators` runs every corpus-wide step (`build_beam`)."""

  name = NAME

  def __init__(self, **kwargs: Any):
    super().__init__(**{**kwargs, "build_path": "memory"})
    self._build_path = "beam"
    self._beam_work = self._work_dir or os.path.join(os.fspath(kwargs.get("data_dir") or "."),
                                                     f".{NAME}_beam_work")

  def _split_generators(self, dl_manager: Any, pipeline: Any) -> dict[str, Any]:
    from lwm_jax.data import build_beam  # pylint: disable=import-outside-toplevel
    kept = build_beam.kept_records(pipeline, self._jsonl_paths, self._cfg, self._beam_work,
                                   self._shard_bytes)
    return {s: self._generate_examples(kept[s], s) for s in SPLITS}

  def _generate_examples(self, recs: Any, split: str = "train"):  # pylint: disable=arguments-renamed
    import apache_beam as beam  # pylint: disable=import-outside-toplevel
    return recs | f"Examples_{split}" >> beam.Map(lambda r: (r.id, r.example()))

  def _finish(self) -> dict[str, Any]:
    from lwm_jax.data import build_beam  # pylint: disable=import-outside-toplevel
    out = build_beam.read_summary(self._beam_work)
    self.load_reports = corpus_build.load_reports(out["summary"])
    self.hygiene_report = corpus_build.hygiene_report(out["summary"])
    if not out["tally"] or not sum(r["trajectories"] for r in out["tally"]["splits"].values()):
      raise corpus_build.nothing_to_build(self._jsonl_paths, out["summary"])
    self.manifest = corpus_build.manifest(self._cfg, out["summary"], out["duplicates"],
                                          out["tally"], out["worlds"])
    return self.manifest

  def _cleanup(self) -> None:
    if self._beam_work:
      p = epath.Path(self._beam_work)
      if p.exists():
        p.rmtree()


@dataclasses.dataclass
class BuildResult:
  data_dir: str
  split_sizes: dict[str, int]
  load_reports: list[LoadReport]
  hygiene: hygiene_lib.HygieneReport
  manifest: dict[str, Any] | None = None


MANIFEST = "MANIFEST.json"


def _have_tensorflow() -> bool:
  import importlib.util  # pylint: disable=import-outside-toplevel
  return importlib.util.find_spec("tensorflow") is not None


class _BucketFiles:
  """The four file calls TFDS's writer makes through TensorFlow when its shuffle buffer spills to
  bucket files on disk (past `MAX_MEM_BUFFER_SIZE`), made through etils.epath instead: without
  TensorFlow (not a dependency of ours) a build of more than about 1 GB of examples would fail."""

  class errors:  # noqa: N801  pylint: disable=invalid-name
    class ResourceExhaustedError(Exception):
      pass

  class io:  # noqa: N801  pylint: disable=invalid-name
    class gfile:  # noqa: N801  pylint: disable=invalid-name
      @staticmethod
      def GFile(path, mode="r"):  # noqa: N802  pylint: disable=invalid-name
        return epath.Path(path).open(mode)

      @staticmethod
      def exists(path) -> bool:
        return epath.Path(path).exists()

      @staticmethod
      def remove(path) -> None:
        epath.Path(path).unlink()


def build(jsonl_paths: Sequence[str], data_dir: str, build_path: str = "memory",
          beam_options: Any = None, beam_runner: Any = None, write_buffer_mb: int = 256,
          **kwargs: Any) -> BuildResult:
  """Builds the ArrayRecord dataset under `data_dir/lwm_trajectories/1.0.0`, and its MANIFEST.json.

  `build_path`: 'memory', 'stream' or 'beam' (same result; see `corpus_build`). With 'beam',
  `beam_options` are Beam pipeline flags (a list, or one string: "--runner=DataflowRunner,...";
  none: the DirectRunner) and `beam_runner` an optional runner object. With 'stream', the TFDS
  writer's shuffle buffer is held to `write_buffer_mb` (TFDS's own default is 1 GB) before it
  spills to disk; the written order is the same either way (sorted by key hash).
  """
  if build_path == "beam":
    from lwm_jax.data import build_beam  # pylint: disable=import-outside-toplevel
    builder: LwmTrajectories = LwmTrajectoriesBeam(jsonl_paths=jsonl_paths, data_dir=data_dir,
                                                   **kwargs)
    dl = tfds.download.DownloadConfig(
        download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS,
        beam_options=build_beam.options(beam_options), beam_runner=beam_runner)
  else:
    builder = LwmTrajectories(jsonl_paths=jsonl_paths, data_dir=data_dir, build_path=build_path,
                              **kwargs)
    dl = tfds.download.DownloadConfig(
        download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS)
  manifest_path = epath.Path(builder.data_dir) / MANIFEST
  try:
    if builder.is_prepared():
      manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else None
    else:
      from tensorflow_datasets.core import shuffle as tfds_shuffle  # pylint: disable=import-outside-toplevel
      buffer, tf_module = tfds_shuffle.MAX_MEM_BUFFER_SIZE, tfds_shuffle.tf
      if build_path == "stream":
        tfds_shuffle.MAX_MEM_BUFFER_SIZE = int(write_buffer_mb) << 20
      if build_path != "beam" and not _have_tensorflow():
        tfds_shuffle.tf = _BucketFiles  # see _BucketFiles
      try:
        builder.download_and_prepare(download_config=dl)
      except Exception as e:  # pylint: disable=broad-except
        if build_path == "beam" and "total number of generated examples is 0" in str(e):
          raise ValueError(
              f"the Beam build writes all of {', '.join(SPLITS)} and one of them got no "
              f"trajectories ({str(e).splitlines()[0][:200]}); choose split fractions that give "
              "every split some, or build with build_path='stream'") from None
        raise
      finally:
        tfds_shuffle.MAX_MEM_BUFFER_SIZE, tfds_shuffle.tf = buffer, tf_module
      manifest = builder._finish()  # pylint: disable=protected-access
      corpus_build.check_conservation(
          manifest, {name: int(info.num_examples) for name, info in builder.info.splits.items()},
          where=f"build_path={build_path}")
      manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
  finally:
    builder._cleanup()  # pylint: disable=protected-access
  sizes = {name: int(info.num_examples) for name, info in builder.info.splits.items()}
  return BuildResult(os.fspath(builder.data_dir), sizes, builder.load_reports,
                     builder.hygiene_report, manifest)


def read_manifest(data_dir: str) -> dict[str, Any]:
  """The MANIFEST.json a build wrote beside its dataset."""
  return json.loads((epath.Path(dataset_dir(data_dir)) / MANIFEST).read_text())


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
