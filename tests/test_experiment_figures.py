"""The RL write-ups' figures are generated from their result files (experiments/figures.py): every
figures block of a write-up equals what the script prints from its folder, so text and files cannot
drift; the zero-variance groups of a GSPO run are counted once per rollout (curves.csv repeats a
rollout's figures on each of its mini-batch rows)."""
import csv
import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXP = os.path.join(ROOT, "experiments")


@pytest.fixture(scope="module")
def figures():
  spec = importlib.util.spec_from_file_location("figures", os.path.join(EXP, "figures.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


# (kind, result folder, write-up, block name)
BLOCKS = [
    ("gspo", "gspo_vs_sft/lr3e-4", "gspo_vs_sft/README.md", "lr3e-4"),
    ("gspo", "gspo_vs_sft/lr5e-5", "gspo_vs_sft/README.md", "lr5e-5"),
    ("gspo", "gspo_vs_sft/from_world_model", "gspo_vs_sft/from_world_model/README.md", ""),
    ("agent", "agent_rl_android", "agent_rl_android/README.md", ""),
    ("agent", "agent_rl_android/seeds", "agent_rl_android/seeds/README.md", ""),
    ("agent", "agent_rl_android/rerun_2026-12", "agent_rl_android/rerun_2026-12/README.md", ""),
    ("agent", "agent_rl_search", "agent_rl_search/README.md", ""),
]


@pytest.mark.parametrize("kind,folder,page,name", BLOCKS)
def test_write_up_figures_are_the_files(figures, kind, folder, page, name):
  got = figures.block_of(os.path.join(EXP, page), name)
  assert got is not None, f"{page}: no figures block {name!r}"
  assert got == figures.KINDS[kind](os.path.join(EXP, folder)), (
      f"{page}: figures differ from {folder}'s files; run experiments/figures.py {kind} "
      f"experiments/{folder} --write=...")


def test_zero_variance_groups_are_counted_once_per_rollout(figures):
  folder = os.path.join(EXP, "gspo_vs_sft", "from_world_model")
  with open(os.path.join(folder, "curves.csv")) as f:
    rows = [r for r in csv.DictReader(f) if r["loss"]]
  per_row = sum(float(r["rollout/zero_variance_groups"]) for r in rows)
  assert per_row == 12  # what the write-up used to say: each rollout counted 4 times
  text = figures.gspo(folder)
  assert "zero-variance groups, counted once per rollout: 3 over 12 rollouts" in text
  assert "3 zero-variance groups over the run" in open(os.path.join(folder, "README.md")).read()
