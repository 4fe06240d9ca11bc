"""The reply format (lwm_jax.data.reply): parse_prediction / split_reasoning on the reply shapes a
world model produces, and the thinking target read back."""
import pytest

from lwm_jax.data.reply import parse_prediction, split_reasoning, strip_reasoning, thinking_target

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
    # cut off while thinking, a complete block written inside the reasoning is still reasoning
    # (the official rule; issue 64: it paid truncated replies)
    ("<think>hmm <predicted_observation>42</predicted_observation> done?", ""),
    # an unfinished block inside unfinished reasoning is not trusted
    ("<think>hmm <predicted_observation>4", ""),
    # cut off while answering: the unclosed final block is tolerated
    ("<think>a</think><predicted_observation>line1\nline2", "line1\nline2"),
    # an unclosed block after a complete one: the complete block wins (issue 21; was "partial")
    ("<predicted_observation>a</predicted_observation><predicted_observation>partial", "a"),
    # with no complete block at all, the last unclosed opening tag's tail is the prediction
    ("<predicted_observation>x <predicted_observation>partial", "partial"),
    # closing tag whose opening sat in the prompt
    ("just the output\n</predicted_observation>\n", "just the output"),
    # indentation of the first line inside a block is kept, blank lines around are dropped
    ("<predicted_observation>\n\n    indented\n  \n</predicted_observation>", "    indented"),
    # several closed think spans and text outside blocks
    ("<think>a</think>x<think>b</think>y", "xy"),
    # reasoning before a stray close, then a closed span, then the answer
    ("r1</think><think>r2</think><predicted_observation>z</predicted_observation>", "z"),
    # a model trained without thinking answers as the history turns read: the header goes
    ("**Environment Observation:**\n  total 0\n", "total 0"),
    ("**Environment Observation:**", ""),
]


@pytest.mark.parametrize("reply,expected", CASES)
def test_parse_prediction(reply, expected):
  assert parse_prediction(reply) == expected


def test_keep_spaces_keeps_a_prompts_trailing_space():
  """A simulated shell returns its prompt as the model wrote it, `# ` included; scoring strips."""
  reply = "<think>t</think>\n<predicted_observation>a.txt\nroot@sandbox:~# </predicted_observation>"
  assert parse_prediction(reply, keep_spaces=True) == "a.txt\nroot@sandbox:~# "
  assert parse_prediction(reply) == "a.txt\nroot@sandbox:~#"
  # blank lines around the block still go, and a cut-off block keeps its last spaces too
  assert parse_prediction("<predicted_observation>\n\nx $ \n  \n</predicted_observation>",
                          keep_spaces=True) == "x $ "
  assert parse_prediction("<think>a</think><predicted_observation>$ ", keep_spaces=True) == "$ "
  # a bare reply, the history turns' header written first (what the shipped model does)
  assert parse_prediction("**Environment Observation:**\nb.txt\nuser@box:~$ \n",
                          keep_spaces=True) == "b.txt\nuser@box:~$ "
  assert parse_prediction("  total 0\n$ ", keep_spaces=True) == "total 0\n$ "
  for reply, expected in CASES:  # on everything else the two agree up to trailing spaces
    assert parse_prediction(reply, keep_spaces=True).rstrip() == expected


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


def test_last_complete_block_beats_truncated_tail():
  """A reply cut off at the token limit must not score as its truncated tail (issue 21)."""
  reply = "<predicted_observation>A</predicted_observation> <predicted_observation>B"
  assert parse_prediction(reply) == "A"
  # also after thinking, and with the unfinished block inside the content of a thinking reply
  assert parse_prediction("<think>t</think>" + reply) == "A"
  assert parse_prediction("<predicted_observation>A</predicted_observation>\n"
                          "<predicted_observation>B</predicted_observation>\n"
                          "<predicted_observation>C cut off") == "B"


@pytest.mark.parametrize("obs,think", [("total 0\n-rw-r--r-- a.txt", ""),
                                       ('{"ok": true}', "the call writes a file")])
def test_thinking_target_reads_back(obs, think):
  target = thinking_target(obs, think)
  assert target.startswith("<think>") and target.endswith("</predicted_observation>")
  assert parse_prediction(target) == obs
  assert split_reasoning(target)[0] == think


def test_strip_reasoning_keeps_an_answer_written_inside_unclosed_thinking():
  reply = "<think>weighing <final_evaluation>{}</final_evaluation>"
  assert strip_reasoning(reply) == ""
  assert strip_reasoning(reply, "<final_evaluation>") == "<final_evaluation>{}</final_evaluation>"
  assert strip_reasoning("a</think> b <think>c</think> d") == "b  d"
