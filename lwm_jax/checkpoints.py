"""Finding, verifying and reading checkpoints; used by training resume, samplers, the server and evals.

`load(path)` gives (model, tokenizer) for serving and accepts three layouts, told apart by their files:

  Hugging Face folder   `<path>/config.json` holding `model_type` (or a `text_config` that does) and
                        at least one `*.safetensors` file; the tokenizer is the folder's
                        `tokenizer.json` or SentencePiece `.model` file. Read by `hf.load_pretrained`.
  training step folder  `<path>/state/` (Orbax PyTree with a `params` entry mirroring
                        `nnx.state(Transformer)`), `<path>/meta/metadata` (JSON with `model` =
                        `ModelConfig.to_dict()` and `tokenizer` = the tokenizer file path) and
                        `<path>/checksums.json`.
  training workdir      `<path>/checkpoints/<step>/` step folders as above (the newest step that
                        passes verification is used) and `<path>/config.json` (the resolved training
                        config; its `data.tokenizer` is the fallback tokenizer path).

Integrity: once Orbax has finished writing a step, `write_checksums` records the size and SHA-256 of
every file of the step folder in `<step>/checksums.json`. `verify_step` re-reads them before a
restore; a changed, truncated or missing file is a `CheckpointError` naming the file. Reading a
workdir falls back from a bad step to the previous one with a warning; a step folder named
explicitly is never replaced by another. Steps without `checksums.json` (written before this check
existed, or by a run killed between Orbax's commit and the checksum write) load with a warning.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import os
from typing import Any

import jax

from lwm_jax import sharding as shd
from lwm_jax.hf import CheckpointError
from lwm_jax.model import abstract_model
from lwm_jax.model.config import ModelConfig

log = logging.getLogger(__name__)

CHECKSUMS = "checksums.json"
STEPS_DIR = "checkpoints"

__all__ = ["CHECKSUMS", "CheckpointError", "check_step", "is_hf_folder", "is_step_dir", "load",
           "check_finite", "orbax_error", "read_meta", "restore_params", "step_dirs", "verify_step",
           "write_checksums"]


# ----------------------------------------------------------------------------------- layouts
def is_step_dir(path: str) -> bool:
  return os.path.isdir(os.path.join(path, "state")) and os.path.isdir(os.path.join(path, "meta"))


def is_hf_folder(path: str) -> bool:
  cfg = os.path.join(path, "config.json")
  if not os.path.isfile(cfg) or not any(f.endswith(".safetensors") for f in os.listdir(path)):
    return False
  try:
    with open(cfg) as f:
      d = json.load(f)
  except (OSError, ValueError):
    return False
  return isinstance(d, dict) and ("model_type" in d or
                                  "model_type" in (d.get("text_config") or {}))


def _check_hf_config(path: str) -> None:
  """A folder with safetensors whose config.json is not an HF config is named as such (rather
  than being taken for a folder with no checkpoint)."""
  cfg = os.path.join(path, "config.json")
  if not os.path.isdir(path) or not os.path.isfile(cfg) or not any(
      f.endswith(".safetensors") for f in os.listdir(path)):
    return
  try:
    with open(cfg) as f:
      d = json.load(f)
  except (OSError, ValueError) as e:
    raise CheckpointError(f"{cfg}: not readable JSON ({e})") from None
  if not isinstance(d, dict):
    raise CheckpointError(f"{cfg}: holds a JSON {type(d).__name__}, expected an object with "
                          "'model_type'")
  if "model_type" not in d and "model_type" not in (d.get("text_config") or {}):
    raise CheckpointError(f"{cfg}: no 'model_type' (nor text_config.model_type)")


def step_dirs(path: str) -> list[str]:
  """Step folders of a workdir (or of its `checkpoints/` folder), newest first; a step folder
  itself gives [path]. Raises FileNotFoundError when there is none."""
  path = os.path.abspath(path)
  if is_step_dir(path):
    return [path]
  root = os.path.join(path, STEPS_DIR) if os.path.isdir(os.path.join(path, STEPS_DIR)) else path
  steps = sorted((int(d) for d in os.listdir(root) if d.isdigit()), reverse=True) \
      if os.path.isdir(root) else []
  if not steps:
    raise FileNotFoundError(f"{path}: no checkpoint (expected <workdir>/{STEPS_DIR}/<step>/ or a "
                            "step folder holding state/ and meta/)")
  return [os.path.join(root, str(s)) for s in steps]


# ------------------------------------------------------------------------------- checksums
def _files(step_dir: str) -> list[str]:
  out = []
  for root, _, names in os.walk(step_dir):
    for n in names:
      rel = os.path.relpath(os.path.join(root, n), step_dir)
      if rel != CHECKSUMS:
        out.append(rel)
  return sorted(out)


def _sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def _digests(step_dir: str, rels: list[str]) -> list[str]:
  # hashlib releases the GIL on large reads: a few threads keep the disk busy.
  with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, max(1, len(rels)))) as ex:
    return list(ex.map(lambda r: _sha256(os.path.join(step_dir, r)), rels))


def write_checksums(step_dir: str) -> str:
  """Records size and SHA-256 of every file under `step_dir` in `<step_dir>/checksums.json`."""
  rels = _files(step_dir)
  files = {r: {"size": os.path.getsize(os.path.join(step_dir, r)), "sha256": d}
           for r, d in zip(rels, _digests(step_dir, rels))}
  out = os.path.join(step_dir, CHECKSUMS)
  tmp = out + ".tmp"
  with open(tmp, "w") as f:
    json.dump({"algorithm": "sha256", "files": files}, f, indent=1, sort_keys=True)
  os.replace(tmp, out)
  return out


def verify_step(step_dir: str) -> bool:
  """True when every file listed in `checksums.json` is present with its recorded size and
  SHA-256; False when the step has no `checksums.json` (nothing to compare with). A mismatch is a
  CheckpointError naming the file."""
  manifest = os.path.join(step_dir, CHECKSUMS)
  if not os.path.exists(manifest):
    return False
  try:
    with open(manifest) as f:
      files = json.load(f)["files"]
    want = {str(r): (int(v["size"]), str(v["sha256"])) for r, v in files.items()}
  except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
    raise CheckpointError(f"{manifest}: unreadable checksum file ({type(e).__name__}: {e})") \
        from None
  for rel, (size, _) in sorted(want.items()):
    full = os.path.join(step_dir, rel)
    if not os.path.isfile(full):
      raise CheckpointError(f"{full}: file missing (listed in {manifest})")
    got = os.path.getsize(full)
    if got != size:
      raise CheckpointError(f"{full}: {got} bytes, {size} when saved (truncated or overwritten)")
  rels = sorted(want)
  for rel, digest in zip(rels, _digests(step_dir, rels)):
    if digest != want[rel][1]:
      raise CheckpointError(f"{os.path.join(step_dir, rel)}: contents changed since the save "
                            f"(SHA-256 {digest[:12]}..., recorded {want[rel][1][:12]}...)")
  return True


def check_step(step_dir: str) -> None:
  """verify_step, with a warning when the step cannot be verified."""
  if not verify_step(step_dir):
    log.warning("%s: no %s; loading it unverified", step_dir, CHECKSUMS)


# ------------------------------------------------------------------------------------ reading
def read_meta(step_dir: str) -> dict[str, Any]:
  """The step's `meta/metadata` JSON (must hold `model`)."""
  p = os.path.join(step_dir, "meta", "metadata")
  try:
    with open(p) as f:
      meta = json.load(f)
  except OSError as e:
    raise CheckpointError(f"{p}: cannot read ({e.strerror})") from None
  except ValueError as e:
    raise CheckpointError(f"{p}: not valid JSON ({e})") from None
  if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict):
    raise CheckpointError(f"{p}: expected a JSON object with a 'model' object")
  return meta


def orbax_error(where: str, e: Exception) -> CheckpointError:
  """One line naming the folder Orbax failed to read and what it said."""
  first = (str(e).strip().splitlines() or [""])[0][:400]
  return CheckpointError(f"{where}: Orbax cannot restore it ({type(e).__name__}: {first})")


def _restore_step(step_dir: str, mesh, rules) -> tuple[ModelConfig, Any, dict[str, Any]]:
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  check_step(step_dir)
  meta = read_meta(step_dir)
  try:
    cfg = ModelConfig.from_dict(meta["model"])
  except (TypeError, ValueError, KeyError) as e:
    raise CheckpointError(f"{os.path.join(step_dir, 'meta', 'metadata')}: field 'model': {e}") \
        from None
  _, abstract = abstract_model(cfg)
  if mesh is None:  # this process's first device; callers may shard afterwards
    one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one),
                          abstract)
  else:
    shardings = shd.state_shardings(abstract, mesh, rules or shd.DEFAULT_RULES)
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, shardings)
  where = os.path.join(step_dir, "state")
  try:
    restored = ocp.PyTreeCheckpointer().restore(where, args=ocp.args.PyTreeRestore(
        item={"params": target},
        restore_args={"params": ocp.checkpoint_utils.construct_restore_args(target)},
        partial_restore=True))
  except Exception as e:  # Orbax and TensorStore raise many types for a damaged folder
    raise orbax_error(where, e) from None
  check_finite(restored["params"], where)
  return cfg, restored["params"], dict(meta, step_dir=step_dir)


def check_finite(tree: Any, where: str) -> None:
  """CheckpointError naming the first leaf of `tree` with a NaN or inf (damaged data that the
  file formats themselves cannot notice)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  for path, leaf in flat:
    dt = getattr(leaf, "dtype", None)
    if dt is None or not jax.numpy.issubdtype(dt, jax.numpy.floating):
      continue
    bad = int(jax.device_get(jax.numpy.size(leaf) - jax.numpy.isfinite(leaf).sum()))
    if bad:
      name = "".join(str(p) for p in path)
      raise CheckpointError(f"{where}: {name} holds {bad} non-finite values (NaN or inf): the "
                            "checkpoint is damaged")
  del np


def restore_params(path: str, mesh: jax.sharding.Mesh | None = None, rules=None
                   ) -> tuple[ModelConfig, Any, dict[str, Any]]:
  """(ModelConfig, parameter nnx.State, info) from a workdir or a step folder.

  The parameters land on this process's first device, or, given a mesh, in the NamedShardings of
  their logical axes (`rules`, default `sharding.DEFAULT_RULES`). A workdir gives its newest step
  that verifies and restores, warning about each newer step skipped. info is the step's meta plus
  `step_dir`. Merge with `nnx.merge(abstract_model(cfg)[0], params)`.
  """
  candidates = step_dirs(path)
  errors = []
  for step_dir in candidates:
    try:
      return _restore_step(step_dir, mesh, rules)
    except CheckpointError as e:
      if len(candidates) == 1:
        raise
      errors.append(str(e))
      log.warning("skipping checkpoint %s: %s; trying the previous step", step_dir, e)
  raise CheckpointError(f"{path}: no step could be restored: " + "; ".join(errors))


def _workdir_tokenizer(path: str) -> str | None:
  """`data.tokenizer` of the nearest training config.json at or above a step folder."""
  p = os.path.abspath(path)
  for _ in range(4):
    cfg = os.path.join(p, "config.json")
    if os.path.isfile(cfg):
      try:
        with open(cfg) as f:
          d = json.load(f)
        return (d.get("data") or {}).get("tokenizer") or None
      except (OSError, ValueError, AttributeError):
        return None
    p = os.path.dirname(p)
  return None


def load(path: str, tokenizer: Any = None, mesh: jax.sharding.Mesh | None = None,
         dtype: Any = None, rules=None):
  """(model, tokenizer) for a Hugging Face folder, a training workdir or a step folder.

  tokenizer: an object or a path overriding what the checkpoint names. dtype: for HF folders
  (see `hf.load_pretrained`). mesh: parameters are placed on it.
  """
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from lwm_jax.data.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  if not os.path.exists(path):
    raise FileNotFoundError(f"checkpoint: {path} does not exist")
  _check_hf_config(path)
  if is_hf_folder(path):
    from lwm_jax import hf  # pylint: disable=import-outside-toplevel
    model = hf.load_pretrained(path, dtype=dtype, mesh=mesh, rules=rules)
    tok_path = path
  else:
    cfg, params, info = restore_params(path, mesh=mesh, rules=rules)
    model = nnx.merge(abstract_model(cfg)[0], params)
    tok_path = info.get("tokenizer") or _workdir_tokenizer(path)
  if tokenizer is None or isinstance(tokenizer, (str, os.PathLike)):
    tok_path = tokenizer or tok_path
    if not tok_path:
      raise ValueError(f"checkpoint {path}: names no tokenizer (meta 'tokenizer' or config "
                       "data.tokenizer); pass one explicitly")
    tokenizer = load_tokenizer(tok_path)
  return model, tokenizer


def read_provenance(folder: str) -> dict | None:
  """The provenance.json in a model folder (how the model was made: launch/reproduce.py --config.ship,
  the drills), or None when the folder has none. A run that starts from a model nests this record
  in its own, so a chain of runs stays traceable to its first model."""
  prov = os.path.join(folder, "provenance.json")
  if not os.path.isfile(prov):
    return None
  with open(prov) as f:
    try:
      return json.load(f)
    except json.JSONDecodeError as e:
      raise CheckpointError(f"{prov}: not valid JSON ({e})") from e


def recorded_thinking(folder: str, default: bool = True) -> bool:
  """Whether the model in `folder` was trained to reply in thinking mode, as its provenance.json
  (written by launch/reproduce.py --config.ship) records it under settings.thinking; `default` when the
  folder has no such record."""
  prov = read_provenance(folder)
  if prov is None:
    return default
  recorded = prov.get("settings", {}).get("thinking")
  if recorded is None:
    return default
  if recorded not in ("on", "off"):
    raise CheckpointError(f"{os.path.join(folder, 'provenance.json')}: settings.thinking is "
                          f"{recorded!r}, not 'on' or 'off'")
  return recorded == "on"


def folder_sha256(path: str) -> str:
  """sha256 over a model folder (or one file): every file's relative path and bytes, in path
  order. What an experiment records of each model it starts from, so a later reader can tell
  whether the folder a write-up names is still the one the run used."""
  if os.path.isfile(path):
    return _sha256(path)
  if not os.path.isdir(path):
    raise FileNotFoundError(f"{path}: no such model folder")
  h = hashlib.sha256()
  rels = sorted(os.path.relpath(os.path.join(d, f), path)
                for d, _, fs in os.walk(path) for f in fs)
  for rel in rels:
    h.update(rel.encode("utf-8") + b"\0")
    h.update(_sha256(os.path.join(path, rel)).encode("ascii") + b"\n")
  return h.hexdigest()


def start_record(path: str) -> dict[str, str]:
  """`{"path", "sha256"}` of a model folder an experiment starts from ("" for a fresh model)."""
  if not path:
    return {"path": "", "sha256": "", "note": "a fresh model (no start folder)"}
  if not os.path.exists(path):
    return {"path": path, "sha256": "", "note": "missing when recorded"}
  return {"path": path, "sha256": folder_sha256(path)}


def models_by_step(path: str):
  """(step, model) for every checkpoint of a workdir, oldest first: each step's parameters merged
  into a fresh model (on this process's first device), for scoring a run step by step."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  for step_dir in reversed(step_dirs(path)):
    cfg, params, info = _restore_step(step_dir, None, None)
    yield int(info["step"]), nnx.merge(abstract_model(cfg)[0], params)
