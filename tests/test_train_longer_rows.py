"""Continued training on rows longer than the start's context extends the model's context.

The start's config.json says how many positions it holds (`max_position_embeddings`), and a
sampler cuts history to fit it. A run that starts from it (`init_from_hf`) and trains on longer
rows must leave a model that says so: before, the start's figure was kept, so a model trained on
4,608-token rows was exported (and evaluated) as a 2,048-token one.
"""
import json

from flax import nnx

from lwm_jax import hf
from lwm_jax.model.config import get_preset
from lwm_jax.model.transformer import Transformer


def _start(tmp_path, context: int) -> str:
  folder = str(tmp_path / "start")
  cfg = get_preset("tiny", vocab_size=128, num_hidden_layers=1, num_experts=4,
                   max_position_embeddings=context)
  hf.save_pretrained(Transformer(cfg, rngs=nnx.Rngs(0)), folder)
  return folder


def _train(tmp_path, start: str, seq_len: int) -> dict:
  from configs import cpt  # pylint: disable=import-outside-toplevel
  from lwm_jax.train import trainer  # pylint: disable=import-outside-toplevel
  c = cpt.get_config("tiny")
  c.model.update(vocab_size=128, num_hidden_layers=1, num_experts=4)
  c.train.update(num_steps=1, batch_size=2, seq_len=seq_len, log_every=0, eval_every=0,
                 progress=False)
  c.checkpoint.update(every=1, use_async=False)
  c.init_from_hf, c.export_hf = start, True
  c.export_hf_dir = str(tmp_path / f"hf{seq_len}")
  trainer.train(c, str(tmp_path / f"run{seq_len}"))
  with open(tmp_path / f"hf{seq_len}" / "config.json", encoding="utf-8") as f:
    return json.load(f)


def test_longer_rows_extend_the_context_and_shorter_ones_keep_it(tmp_path):
  start = _start(tmp_path, 64)
  assert _train(tmp_path, start, 96)["max_position_embeddings"] == 96
  assert _train(tmp_path, start, 32)["max_position_embeddings"] == 64
