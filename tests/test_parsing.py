"""parse_prediction / split_reasoning on the reply shapes a world model produces."""
import pytest

from lwm_jax.sampling.parsing import parse_prediction, split_reasoning

CASES = [
    # (reply, expected prediction)
    ("<think>plan</think>\n<predicted_observation>\nfile.txt\n</predicted_observation>", "file.txt"),
    # the last block wins, also over a draft inside the reasoning
    ("<think>draft: <predicted_observation>x</predicted_observation></think>"
     "<predicted_observation>a</predicted_observation> then <predicted_observation>b"
     "</predicted_observation>", "b"),
    # opening <think> in the chat template: the reply only closes it
    ("reasoning here</think>\n\n<predicted_observation>ok</predicted_observation>", "ok"),
    ("reasoning here</think>\nbare answer\n", "bare answer"),
    # no tags at all: the whole text, stripped
    ("  total 0\n", "total 0"),
    ("", ""),
    # cut off while thinking: nothing to predict
    ("<think>I believe the output is 42", ""),
    # cut off while thinking, but a complete block was written inside the reasoning
    ("<think>hmm <predicted_observation>42</predicted_observation> done?", "42"),
    # an unfinished block inside unfinished reasoning is not trusted
    ("<think>hmm <predicted_observation>4", ""),
    # cut off while answering: the unclosed final block is tolerated
    ("<think>a</think><predicted_observation>line1\nline2", "line1\nline2"),
    ("<predicted_observation>a</predicted_observation><predicted_observation>partial",
     "partial"),
    # closing tag whose opening sat in the prompt
    ("just the output\n</predicted_observation>\n", "just the output"),
    # indentation of the first line inside a block is kept, blank lines around are dropped
    ("<predicted_observation>\n\n    indented\n  \n</predicted_observation>", "    indented"),
    # several closed think spans and text outside blocks
    ("<think>a</think>x<think>b</think>y", "xy"),
    # reasoning before a stray close, then a closed span, then the answer
    ("r1</think><think>r2</think><predicted_observation>z</predicted_observation>", "z"),
]


@pytest.mark.parametrize("reply,expected", CASES)
def test_parse_prediction(reply, expected):
  assert parse_prediction(reply) == expected


def test_split_reasoning():
  assert split_reasoning("<think> plan </think>\nanswer") == ("plan", "answer")
  assert split_reasoning("plan</think>answer") == ("plan", "answer")
  assert split_reasoning("no thinking") == ("", "no thinking")
  assert split_reasoning("pre <think>cut off") == ("cut off", "pre")
  r, c = split_reasoning("<think>a</think>mid<think>b</think>"
                         "<predicted_observation>o</predicted_observation>")
  assert r == "a\n\nb"
  assert c == "mid<predicted_observation>o</predicted_observation>"


def test_thinking_never_leaks():
  secret = "SECRET-REASONING"
  for reply in (f"<think>{secret}</think>obs", f"{secret}</think>obs", f"<think>{secret}",
                f"<think>{secret}<predicted_observation>obs</predicted_observation>"):
    assert secret not in parse_prediction(reply)
