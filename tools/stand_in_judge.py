"""A stand-in judge for checking evaluation clients end to end without a real judge model.

An OpenAI-compatible `POST /v1/chat/completions` that grades deterministically: it finds the
prediction and the reference in the judge prompt (the official client's layout, with
'World Model Output (Simulated)' and 'Ground Truth (Real Output)' fenced blocks, or ours, with
<simulated_observation> and <reference_observation>), computes word-level F1 between them and
answers in the official reply shape (a <final_evaluation> block around fenced JSON with nested
`scores`), which both clients parse. Scores: factuality = consistency = 1 + round(4 F1),
format = 2 + round(3 F1), realism = 3, quality = 1 + round(2 F1). A prompt without both blocks
gets a reply without scores (a failed judgement).

  python tools/stand_in_judge.py --port=8001
"""
from __future__ import annotations

import argparse
import collections
import http.server
import json
import re
import threading
import time

_PRED = [(r"\*\*World Model Output \(Simulated\):\*\*\n```\n", r"\n```\n\n\*\*Ground Truth"),
         (r"<simulated_observation>\n", r"\n</simulated_observation>")]
_REF = [(r"\*\*Ground Truth \(Real Output\):\*\*\n```\n", r"\n```"),
        (r"<reference_observation>\n", r"\n</reference_observation>")]


def _find(text: str, patterns) -> str | None:
  for start, end in patterns:
    m = re.search(start + r"(.*?)" + end, text, re.S)
    if m:
      return m.group(1)
  return None


def word_f1(pred: str, ref: str) -> float:
  p = collections.Counter(re.findall(r"\w+", pred.lower()))
  r = collections.Counter(re.findall(r"\w+", ref.lower()))
  if not p and not r:
    return 1.0
  common = sum((p & r).values())
  if not common:
    return 0.0
  precision, recall = common / sum(p.values()), common / sum(r.values())
  return 2 * precision * recall / (precision + recall)


def grade(user_prompt: str) -> str:
  pred, ref = _find(user_prompt, _PRED), _find(user_prompt, _REF)
  if pred is None or ref is None:
    return "Neither observation was found in the prompt."
  if pred.strip() == "No output":  # the official client's placeholder for an empty answer
    pred = ""
  f1 = word_f1(pred, ref)
  fact = 1 + round(4 * f1)
  scores = {"format": 2 + round(3 * f1), "factuality": fact, "consistency": fact, "realism": 3,
            "quality": 1 + round(2 * f1)}
  verdict = json.dumps({"strengths": [f"word F1 {f1:.3f}"], "weaknesses": [], "scores": scores},
                       indent=2)
  return f"Compared word by word.\n<final_evaluation>\n```json\n{verdict}\n```\n</final_evaluation>"


class _Handler(http.server.BaseHTTPRequestHandler):
  requests = 0

  def do_POST(self):  # noqa: N802
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    type(self).requests += 1
    text = grade(body["messages"][-1]["content"])
    data = json.dumps({
        "id": f"judge-{self.requests}", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model", "stand-in"),
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}).encode()
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    pass


def start(port: int = 0) -> tuple[http.server.ThreadingHTTPServer, str]:
  """Serves in a daemon thread; returns the server and its base URL (…/v1)."""
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Handler)
  threading.Thread(target=httpd.serve_forever, daemon=True).start()
  return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/v1"


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--port", type=int, default=8001)
  args = ap.parse_args()
  http.server.ThreadingHTTPServer(("127.0.0.1", args.port), _Handler).serve_forever()


if __name__ == "__main__":
  main()
