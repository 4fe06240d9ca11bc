"""The judge request built by the official AgentWorldBench client's own code, read at run time.

`--official_client=DIR` names the root of the user's checkout of the official repository
(QwenLM/Qwen-AgentWorld). Its text is not in this repository: this module imports the checkout's
`eval/eval.py` (and through it `eval/lwm_eval_utils/`) from DIR when a judge run starts, and asks
it for everything the client itself would do:

- the judge system prompts: the package's `load_judge_system_prompts()` (it reads DIR/prompts/);
- the model output the judge sees: `parse_model_output(gen, response_tag)` with the domain's
  `response_tag` from `TASK_CONFIGS`, `gen` being the generation as the server returned it;
- the request: `build_judge_messages(job, model_output, prompts)` on the benchmark record as
  it stands in the file (a dict in the file's layout);
- the reply: `parse_judge_output(raw, response_tag=...)`; a reply is usable when it reports
  success, and its scores are kept exactly as the client records them.

So the messages sent to a judge are the client's, byte for byte (checked against the real client
in docs/benchmark.md and against a stand-in module of ours, tests/fixtures/official_client/, by
tests/test_official_client.py). The entry points the client has today are what this module calls;
one that is missing is an error naming the file and the name.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from typing import Any, Mapping, Sequence

from lwm_jax.judge import DIMENSIONS, JudgeStyle, Messages

NEEDED = ("build_judge_messages", "parse_judge_output", "parse_model_output",
          "load_judge_system_prompts", "TASK_CONFIGS", "get_subtask")


class OfficialClientError(RuntimeError):
  """The checkout at --official_client cannot be used (named file or entry point missing)."""


class _Beside(importlib.abc.MetaPathFinder):
  """Finds top-level modules in one folder first, as Python does for a script run from there:
  the checkout's eval.py imports its own `lwm_eval_utils` package that lives beside it."""

  def __init__(self, folder: str):
    self.folder = folder

  def find_spec(self, name, path=None, target=None):
    if path is not None:  # a submodule: its package's own __path__ finds it
      return None
    return importlib.machinery.PathFinder.find_spec(name, [self.folder], target)


@contextlib.contextmanager
def _beside(folder: str):
  finder = _Beside(folder)
  sys.meta_path.insert(0, finder)
  try:
    yield
  finally:
    sys.meta_path.remove(finder)


def import_file(path: str, name: str, fresh: Sequence[str] = ()) -> Any:
  """The Python file `path` as module `name`, importing top-level modules from its own folder
  first (as when it runs as a script); the modules named in `fresh` (and their submodules) are
  dropped first, so two checkouts never share them."""
  for mod in [n for n in sys.modules if n.split(".")[0] in fresh]:
    del sys.modules[mod]
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  with _beside(os.path.dirname(os.path.abspath(path))):
    spec.loader.exec_module(module)
  return module


def load_client(root: str | os.PathLike) -> Any:
  """The checkout's `eval/eval.py` as a module (its own `lwm_eval_utils` imported beside it)."""
  root = os.path.abspath(os.fspath(root))
  path = os.path.join(root, "eval", "eval.py")
  if not os.path.isfile(path):
    raise OfficialClientError(f"--official_client {root}: no eval/eval.py (expected the root of "
                              "a checkout of the official Qwen-AgentWorld repository)")
  # A fresh import each time: two checkouts (or a test's stand-in) never share modules.
  try:
    module = import_file(path, "_official_eval_client", fresh=("lwm_eval_utils",))
  except ImportError as e:
    raise OfficialClientError(f"{path}: cannot be imported ({e}); the official client needs "
                              "its own dependencies (the `openai` package)") from None
  missing = [n for n in NEEDED if not hasattr(module, n)]
  if missing:
    raise OfficialClientError(f"{path}: has no {', '.join(missing)} (this version of the "
                              "official client is not one lwm_jax knows how to call)")
  return module


def _tags(client: Any, domain: str) -> tuple[str, str]:
  configs = client.TASK_CONFIGS
  cfg = configs.get(domain, configs.get("mcp", {}))
  return (cfg.get("response_tag", "predicted_observation"),
          cfg.get("judge_response_tag", "final_evaluation"))


def generation_of(row: Mapping[str, Any]) -> str:
  """The generation as the model returned it: `gen` (the client's files), else `raw` (ours),
  else our parsed `prediction`."""
  for k in ("gen", "raw", "prediction"):
    if isinstance(row.get(k), str):
      return row[k]
  return ""


def official_client_style(root: str | os.PathLike) -> JudgeStyle:
  """A judge style whose requests and parsing are the official client's (module docstring)."""
  client = load_client(root)
  prompts = client.load_judge_system_prompts()
  prompts_dir = os.path.join(os.path.abspath(os.fspath(root)), "prompts")

  def record_messages(job: dict, row: Mapping[str, Any]) -> Messages:
    domain = client.get_subtask(job)
    if not prompts.get(domain):
      raise FileNotFoundError(f"{os.path.join(prompts_dir, domain, 'judge_system_prompt.txt')}: "
                              f"no judge system prompt for domain '{domain}' in the official "
                              "client's checkout")
    output = client.parse_model_output(generation_of(row), _tags(client, domain)[0])
    return client.build_judge_messages(job, output, prompts)

  def parse(text: str) -> dict[str, Any] | None:
    tag = client.TASK_CONFIGS.get("mcp", {}).get("judge_response_tag", "final_evaluation")
    out = client.parse_judge_output(text or "", response_tag=tag)
    if not out.get("success"):
      return None
    scores = out.get("scores") or {}
    weaknesses = [str(w) for w in out.get("weaknesses") or []]
    return {"scores": {d: scores.get(d, 0) for d in DIMENSIONS}, "reason": "; ".join(weaknesses),
            "strengths": [str(x) for x in out.get("strengths") or []], "weaknesses": weaknesses,
            "total_score": out.get("total_score")}

  def messages(*_a) -> Messages:
    raise TypeError("the official client's judge request is built from the whole record "
                    "(JudgeStyle.record_messages)")

  return JudgeStyle("official", messages, parse, lambda p: p is not None,
                    record_messages=record_messages)


def judge_protocol(style_name: str, official_client: str | None, drop_empty: bool) -> str:
  """One line saying which judge protocol a run follows (the CLI prints it before judging)."""
  empty = ("empty generations dropped as the official client drops them" if drop_empty else
           "empty generations judged (the official client drops them: --drop_empty)")
  if official_client:
    return (f"judge protocol: the official client's own request and parser from "
            f"{official_client}; {empty}")
  if style_name == "official":
    return ("judge protocol: official layout with our wording of the request (figures are NOT "
            "comparable with published ones; pass --official_client=DIR for the client's own "
            f"request); {empty}")
  return ("judge protocol: our rubric (figures are NOT comparable with published ones; "
          f"--official_client=DIR runs the official request); {empty}")
