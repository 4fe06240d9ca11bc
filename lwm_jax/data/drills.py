"""Copy drills: plain documents that only copying from the context can predict.

A world model must often write out what its context already holds (an `ls` lists the file names
of the initial state, a tool returns the page size its instruction names); a small model trained
on trajectories alone does not learn to look things up (docs/reproduce.md, "Copying"). A drill is
a listing of made-up names (files, identifiers, numbers, dates: random letters and digits, so no
prior knowledge predicts them) written twice, separated by a blank line: the second copy is
predictable from the first and from nothing else. CPT mixes drills in as knowledge text (full
loss), `launch/reproduce.py --config.knowledge=...,copy`.

Text drills alone do not start copying in a CPT's budget: a small model sits on a long plateau
before an induction circuit forms. `induction_rows` makes the classic induction task (random ids
written twice, in short rows first) that `launch/copy_drill.py` trains on to get past it, and
`induction_sample` the same task as CPT samples that a run mixes in beside the trajectories
(data config `drill_share` / `drill_rows`, `launch/reproduce.py --config.drill_share`), so the drill
does not overwrite what the model knows.

In an induction row each copy follows its source at once (16-64 ids back at rows of 512), while
a world model must at times copy from much further back (a simulation instruction sits up to
about 1,500 tokens before the observation that should follow it). A far row (`far<N>` in
`drill_rows`, `far_rows`) writes short segments over its first half and the same segments again
in a shuffled order over its second, so a copy's source lies anywhere up to N ids back and can
only be found by what it says, not by where it is. `lookup_drills` (knowledge source `lookup`)
practise the lookup an `ls` needs: a made-up file tree as paths, then listings of it.
"""
from __future__ import annotations

import random
from typing import NamedTuple, Sequence, Union

import numpy as np

from lwm_jax.data.documents import Document, sample_arrays

# samples of the index-seeded drill stream repeat after this many (>= 64 million ids at rows of 64)
DRILL_PERIOD = 1_000_000

_CONSONANTS = "bcdfghjklmnprstvwxz"
_VOWELS = "aeiou"
_EXTENSIONS = (".txt", ".log", ".csv", ".json", ".py", ".md", ".sh", ".yaml", ".db", "")
_SEPARATORS = ("\n", "  ", ", ", " ")


def made_up_word(rng: random.Random) -> str:
  """A pronounceable made-up word of 1-3 syllables."""
  return "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) + rng.choice(("", rng.choice(_CONSONANTS)))
                 for _ in range(rng.randint(1, 3)))


def _item(rng: random.Random) -> str:
  """One made-up name: a file name, an identifier, a number, a date or a hex id."""
  kind = rng.randrange(5)
  if kind == 0:
    joiner = rng.choice("-_")
    parts = [made_up_word(rng) for _ in range(rng.randint(1, 2))]
    if rng.random() < 0.5:
      parts.append(f"{rng.randint(0, 99):02d}")
    return joiner.join(parts) + rng.choice(_EXTENSIONS)
  if kind == 1:
    return "_".join(made_up_word(rng) for _ in range(rng.randint(1, 3)))
  if kind == 2:
    return str(rng.randint(0, 10 ** rng.randint(1, 6)))
  if kind == 3:
    return f"20{rng.randint(10, 29)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
  return "".join(rng.choice("0123456789abcdef") for _ in range(rng.randint(4, 10)))


def copy_drills(count: int, seed: int = 0, min_items: int = 3, max_items: int = 30
                ) -> list[Document]:
  """`count` drills, deterministic per `seed`: each a listing of `min_items`-`max_items` made-up
  names (one separator per drill), a blank line, and the same listing again."""
  if count < 0 or not 1 <= min_items <= max_items:
    raise ValueError(f"copy_drills: need count >= 0 and 1 <= min_items <= max_items, got "
                     f"{count}, {min_items}, {max_items}")
  rng = random.Random(seed)
  out = []
  for i in range(count):
    sep = rng.choice(_SEPARATORS)
    listing = sep.join(_item(rng) for _ in range(rng.randint(min_items, max_items)))
    out.append(Document(f"drill/copy/{i}", listing + "\n\n" + listing, ""))
  return out


def _file_name(rng: random.Random) -> str:
  """A made-up file name, always with an extension."""
  parts = [made_up_word(rng) for _ in range(rng.randint(1, 2))]
  if rng.random() < 0.4:
    parts.append(f"{rng.randint(0, 99):02d}")
  return rng.choice("-_").join(parts) + rng.choice(_EXTENSIONS[:-1])


def _ls_recursive(top: list[str], tree: dict[str, list[str]]) -> str:
  """The tree as `ls -R` writes it (one level of directories, entries sorted)."""
  blocks = [".:\n" + "  ".join(top)]
  blocks += [f"./{d}:\n" + "  ".join(tree[d]) for d in sorted(tree)]
  return "\n\n".join(blocks)


def lookup_drills(count: int, seed: int = 0) -> list[Document]:
  """`count` lookup drills, deterministic per `seed`. Each lists a made-up directory tree as the
  paths of its files (as a terminal episode's initial state does), then answers a few listings
  of it: `ls DIR` (the file names under DIR), `ls` (the top level) or `ls -R` (every directory);
  the names are random, so only looking them up in the paths above predicts the answers. A world
  model asked `ls notes` must do exactly this with the system prompt's initial state."""
  if count < 0:
    raise ValueError(f"lookup_drills: need count >= 0, got {count}")
  rng = random.Random(seed)
  out = []
  for i in range(count):
    dirs = sorted({made_up_word(rng) for _ in range(rng.randint(2, 5))})
    tree = {d: sorted({_file_name(rng) for _ in range(rng.randint(1, 5))}) for d in dirs}
    loose = sorted({_file_name(rng) for _ in range(rng.randint(0, 3))})
    paths = sorted(loose + [f"{d}/{f}" for d in dirs for f in tree[d]])
    top = sorted(loose + dirs)
    parts = ["Files under ~:\n" + "\n".join(paths)]
    for _ in range(rng.randint(2, 4)):
      kind = rng.random()
      if kind < 0.6:
        d = rng.choice(dirs)
        parts.append(f"$ ls {d}\n" + "  ".join(tree[d]))
      elif kind < 0.8:
        parts.append("$ ls\n" + "  ".join(top))
      else:
        parts.append("$ ls -R\n" + _ls_recursive(top, tree))
    out.append(Document(f"drill/lookup/{i}", "\n\n".join(parts), ""))
  return out


def induction_rows(rng: np.random.Generator, n: int, row: int, alphabet: int,
                   segment: tuple[int, int], first_id: int = 3) -> tuple[np.ndarray, np.ndarray]:
  """`n` rows of `row` token ids for the induction drill (`launch/copy_drill.py`): each row is
  segments of `segment[0]`-`segment[1]` ids drawn uniformly from `first_id` .. `first_id +
  alphabet - 1`, each segment written twice (the last one cut at the row's end). Returns the ids
  and a mask of the targets that only copying predicts (the second copies)."""
  toks = np.zeros((n, row), np.int32)
  second = np.zeros((n, row), bool)
  for r in range(n):
    i = 0
    while i < row:
      k = int(rng.integers(segment[0], segment[1] + 1))
      seg = rng.integers(first_id, first_id + alphabet, k)
      both = np.concatenate([seg, seg])[: row - i]
      toks[r, i:i + len(both)] = both
      second[r, i + k:i + len(both)] = True
      i += len(both)
  return toks, second


def far_rows(rng: np.random.Generator, n: int, row: int, alphabet: int,
             segment: tuple[int, int] = (4, 32), first_id: int = 3
             ) -> tuple[np.ndarray, np.ndarray]:
  """`n` far rows of `row` token ids: segments of `segment[0]`-`segment[1]` ids drawn uniformly
  from `first_id` .. `first_id + alphabet - 1` fill the first half (the last one cut to fit), and
  the same segments, in a random order, the second half (an odd row ends with one more random
  id). Returns the ids and a mask of the targets that copying predicts: every id of the second
  half but each segment's first (which segment comes next is random)."""
  toks = np.zeros((n, row), np.int32)
  copied = np.zeros((n, row), bool)
  half = row // 2
  for r in range(n):
    segs, used = [], 0
    while used < half:
      k = min(int(rng.integers(segment[0], segment[1] + 1)), half - used)
      segs.append(rng.integers(first_id, first_id + alphabet, k))
      used += k
    toks[r, :half] = np.concatenate(segs)
    i = half
    for j in rng.permutation(len(segs)):
      toks[r, i:i + len(segs[j])] = segs[j]
      copied[r, i + 1:i + len(segs[j])] = True
      i += len(segs[j])
    toks[r, i:] = rng.integers(first_id, first_id + alphabet, row - i)
  return toks, copied


def segment_range(row: int) -> tuple[int, int]:
  """Segment lengths of the induction drill in rows of `row` ids: 2-8 at 64, 16-64 at 512."""
  return max(2, 16 * row // 512), max(3, 64 * row // 512)


def drill_alphabet(vocab_size: int, special_ids) -> np.ndarray:
  """The ids a drill draws from: every id from 3 up (SentencePiece's unknown, begin and end sit
  below) that is not a special token of the chat template."""
  specials = set(int(i) for i in special_ids)
  ids = np.array([i for i in range(3, vocab_size) if i not in specials], np.int32)
  if len(ids) < 2:
    raise ValueError(f"drill_alphabet: a vocabulary of {vocab_size} leaves {len(ids)} ids")
  return ids


class DrillRow(NamedTuple):
  """One kind of drill row: `length` ids, an induction row or (`far`) a far row."""
  length: int
  far: bool = False

  def __str__(self) -> str:
    return f"far{self.length}" if self.far else str(self.length)


def parse_drill_rows(text: str) -> tuple[DrillRow, ...]:
  """'64,far1024' -> (DrillRow(64), DrillRow(1024, far=True)): the rows of the drill stream, each
  8 .. 4096 ids, an induction row or, written `far<N>`, a far row."""
  rows = []
  for x in (x.strip() for x in str(text).split(",")):
    if not x:
      continue
    far = x.startswith("far")
    try:
      rows.append(DrillRow(int(x[3:] if far else x), far))
    except ValueError:
      raise ValueError(f"data config field 'drill_rows': {text!r}: {x!r} is neither a row length "
                       "nor far<length>") from None
  if not rows or any(not 8 <= r.length <= 4096 for r in rows):
    raise ValueError(f"data config field 'drill_rows': {text!r}: each row must be 8 .. 4096 ids")
  return tuple(rows)


def induction_sample(index: int, rows: Sequence[Union[int, DrillRow]], alphabet: np.ndarray,
                     marker: int, seed: int = 0) -> dict[str, np.ndarray]:
  """Sample `index` of the CPT drill stream (deterministic per `index` and `seed`): a `marker`
  with no loss, then a row of one of `rows` (an int or an induction `DrillRow`: an induction row;
  a far `DrillRow`: a far row; drawn with probability in proportion to 1 / length, so every
  kind gets the same share of the tokens), full loss, in the pipeline's sample layout (`n_drill`
  counts its tokens)."""
  rng = np.random.default_rng([seed, index])
  kinds = [r if isinstance(r, DrillRow) else DrillRow(int(r)) for r in rows]
  inv = 1.0 / np.asarray([k.length for k in kinds], np.float64)
  kind = kinds[rng.choice(len(kinds), p=inv / inv.sum())]
  if kind.far:
    pos, _ = far_rows(rng, 1, kind.length, len(alphabet), first_id=0)
  else:
    pos, _ = induction_rows(rng, 1, kind.length, len(alphabet), segment_range(kind.length),
                            first_id=0)
  ids = np.concatenate([[marker], alphabet[pos[0]]]).astype(np.int32)
  weights = np.ones(len(ids), np.float32)
  weights[0] = 0.0
  return sample_arrays(ids, weights, n_drill=len(ids))


# ----------------------------------------------------------------------- rows of the listing drill
def is_listing(action: str) -> bool:
  """A listing turn: an `ls` command, answered from the initial state's file list."""
  return action.split()[:1] == ["ls"]


def word_piece_ids(sp_path: str) -> np.ndarray:
  """Ids of a SentencePiece model's plain word pieces (letters and digits, with or without the
  leading space mark): what the listing drill's copy rows are drawn from."""
  import re  # pylint: disable=import-outside-toplevel
  import sentencepiece as spm  # pylint: disable=import-outside-toplevel
  sp = spm.SentencePieceProcessor(model_file=sp_path)
  ids = np.array([i for i in range(sp.get_piece_size())
                  if re.fullmatch(r"\u2581?[A-Za-z0-9]+", sp.id_to_piece(i))], np.int32)
  if len(ids) < 2:
    raise ValueError(f"{sp_path}: {len(ids)} plain word pieces; copy rows need at least 2")
  return ids


def copy_row(rng: np.random.Generator, pieces: np.ndarray, seq_len: int, short: int = 0
             ) -> tuple[list[int], list[float], np.ndarray | None]:
  """(ids, weights, segment ids or None) of a copy row of random word `pieces`, the loss on the
  targets only copying predicts. `short` 0: one far row (`far_rows`: segments over the first
  half, the same segments in a shuffled order over the second; segment ids None: one document);
  else seq_len // short induction rows of `short` pieces (`induction_rows`, segments of
  `segment_range(short)` written twice), packed as documents of their own, segment ids 1, 2, ...
  (positions restart and attention stays inside each)."""
  if not short:
    pos, copied = far_rows(rng, 1, seq_len, len(pieces), first_id=0)
    return pieces[pos[0]].tolist(), copied[0].astype(np.float32).tolist(), None
  n = seq_len // short
  pos, copied = induction_rows(rng, n, short, len(pieces), segment_range(short), first_id=0)
  return (pieces[pos.reshape(-1)].tolist(), copied.reshape(-1).astype(np.float32).tolist(),
          np.repeat(np.arange(1, n + 1), short))


# ----------------------------------------------------------------------- rows of the departure drill
def departing_turns(perturbed, plain) -> list[bool]:
  """Per turn of `perturbed` (a schema.Trajectory): whether its perturbation changed the real
  observation there, i.e. every action up to it agrees with the `plain` twin's (the same episode
  played without perturbation) and the observations differ. All False without a twin."""
  out, agree = [], plain is not None
  for k, turn in enumerate(perturbed.turns):
    twin = plain.turns[k] if agree and k < len(plain.turns) else None
    agree = twin is not None and twin.action == turn.action
    out.append(agree and twin.observation != turn.observation)
  return out


def departing(ids_a: Sequence[int], w_a: Sequence[float], ids_b: Sequence[int],
              w_b: Sequence[float]) -> tuple[list[int], list[int]]:
  """Positions (in each of two rendered samples) of the target tokens outside the equal blocks of
  a diff of the two targets; where one side only lacks tokens, the other side's token at that
  point (the one written instead)."""
  import difflib  # pylint: disable=import-outside-toplevel
  pa = [i for i, x in enumerate(w_a) if x > 0]
  pb = [i for i, x in enumerate(w_b) if x > 0]
  ta, tb = [ids_a[i] for i in pa], [ids_b[i] for i in pb]
  da, db = set(), set()
  for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes():
    if tag == "equal":
      continue
    da.update(range(i1, max(i2, min(i1 + 1, len(ta)))))
    db.update(range(j1, max(j2, min(j1 + 1, len(tb)))))
  return [pa[i] for i in sorted(da)], [pb[j] for j in sorted(db)]


def parse_phases(text: str, tokens_per_step: int = 8192) -> list[tuple[int, int]]:
  """'64:1000,512:400' -> [(64, 1000), (512, 400)], each row a divisor of
  `tokens_per_step` (the induction drill's batch) and >= 8; a bad part is named as `--phases`."""
  phases = []
  for part in text.split(","):
    try:
      row, steps = (int(x) for x in part.split(":"))
    except ValueError:
      raise SystemExit(f"--phases: {part!r} is not ROW:STEPS") from None
    if row < 8 or tokens_per_step % row or steps < 1:
      raise SystemExit(f"--phases: {part!r}: ROW must divide {tokens_per_step} and be >= 8, "
                       "STEPS >= 1")
    phases.append((row, steps))
  return phases


FLAG_A, FLAG_B, FLAG_QUERY, FLAG_FIRST_FILLER = 3, 4, 5, 16
FLAG_ANSWER_LEN = 8


def flag_answers(vocab: int) -> dict[int, np.ndarray]:
  """The flag drill's two fixed answers of FLAG_ANSWER_LEN ids (no id shared), drawn once from a
  fixed seed among the filler ids of a `vocab`-id vocabulary: answer X follows flag A, Y flag B."""
  ids = np.random.default_rng(7).choice(np.arange(FLAG_FIRST_FILLER, vocab),
                                        2 * FLAG_ANSWER_LEN, replace=False)
  return {FLAG_A: ids[:FLAG_ANSWER_LEN], FLAG_B: ids[FLAG_ANSWER_LEN:]}


def flag_rows(rng: np.random.Generator, n: int, row: int, vocab: int
              ) -> tuple[np.ndarray, np.ndarray]:
  """`n` rows of the distant-flag drill: random filler ids, one flag (A or B, even odds) somewhere
  in the first 48 positions, the query id at `row - 9` and the flag's answer in the last 8. Returns
  the ids and the loss weights (1 on the answer ids only): a model that ignores the flag pays
  ln 2 on the first answer id, one that reads it nothing."""
  if row < 48 + 1 + FLAG_ANSWER_LEN:
    raise ValueError(f"a flag row needs at least {48 + 1 + FLAG_ANSWER_LEN} ids, got {row}")
  answers = flag_answers(vocab)
  toks = rng.integers(FLAG_FIRST_FILLER, vocab, (n, row)).astype(np.int32)
  weight = np.zeros((n, row), np.float32)
  for r in range(n):
    flag = FLAG_A if rng.random() < 0.5 else FLAG_B
    toks[r, rng.integers(0, 48)] = flag
    toks[r, row - FLAG_ANSWER_LEN - 1] = FLAG_QUERY
    toks[r, row - FLAG_ANSWER_LEN:] = answers[flag]
    weight[r, row - FLAG_ANSWER_LEN:] = 1.0
  return toks, weight
