"""The web domain's task verifiers (the record's `verifier` and `transcript_verifier`).

`check(env, goal, turns)` judges a finished episode on the real environment's state;
`check_transcript(env, goal, turns)` judges it from the transcript alone, with `env` only reset to
the episode's world. What each checks is listed in `lwm_jax/envs/verify.py` and
`lwm_jax/envs/verify_transcript.py`, which dispatch to these through the domain registry.
"""
from __future__ import annotations

import re
from typing import Any

from lwm_jax.envs import verify as V
from lwm_jax.envs.verify import Turns, Verdict, _v


def _web_account_seen(g: dict[str, Any], turns: Turns) -> bool:
  return any(o.startswith('Page "Account - Shop"') and f'link "Account ({g["user"]})"' in o
             for _, o in turns)


def _web_refused(g: dict[str, Any], turns: Turns) -> bool:
  """The shop refused the quantity ("Only N of X in stock."), or the product page showed its stock."""
  refusal = re.compile(rf"Only \d+ of {re.escape(g['product'])} in stock")
  page = f'Page "{g["product"]} - Shop"'
  return any(refusal.search(o) or (page in o and "In stock: " in o) for _, o in turns)


def _cheapest(world: dict[str, Any], category: str) -> tuple[float, list[dict[str, Any]]]:
  prods = [p for p in world["products"] if p["category"] == category]
  low = min(p["price"] for p in prods)
  return low, [p for p in prods if p["price"] == low]


def _web_cheapest(world: dict[str, Any], g: dict[str, Any], turns: Turns) -> Verdict:
  """The answer is the last product page the agent opened."""
  low, best = _cheapest(world, g["category"])
  pages = [m.group(1) for _, o in turns for m in [_PRODUCT_PAGE.match(o)] if m]
  last = pages[-1] if pages else None
  ok = last in {str(p["id"]) for p in best}
  return _v(ok, 0, f"last product page opened: {'/product/' + last if last else 'none'}; cheapest in "
                   f"{g['category']}: {', '.join(p['name'] for p in best)} (${low:.2f})")


_PRODUCT_PAGE = re.compile(r'^(?:Error: .*\n)?Page "[^\n]*" at http://shop\.local/product/(\d+)\n')


def check(env: Any, g: dict[str, Any], turns: Turns) -> Verdict:
  world = env.server.state.world
  k = g["kind"]
  if k == "cheapest":
    return _web_cheapest(world, g, turns)
  if k == "account":
    ok = _web_account_seen(g, turns)
    return _v(ok, 0, f"account page of {g['user']} {'shown' if ok else 'never shown'}")
  prod = next(p for p in world["products"] if p["name"] == g["product"])
  first_id = max((o["id"] for o in world["orders"]), default=1000)
  new = [o for o in env.server.state.orders if o["id"] > first_id]
  if prod["stock"] < g["qty"]:
    bought = [o for o in new if prod["id"] in o["cart"]]
    refused = _web_refused(g, turns)
    return _v(not bought and refused, 0,
              f"only {prod['stock']} in stock for {g['qty']} asked: {len(bought)} orders of it placed, "
              f"refusal {'seen' if refused else 'not seen'}")
  want = {"user": g["user"], "cart": {prod["id"]: g["qty"]}, "shipping": g["shipping"],
          "address": g["address"]}
  best = 0.0
  for o in new:
    got = {"user": o["user"], "cart": o["cart"], "shipping": o["shipping"], "address": o["address"].strip()}
    best = max(best, sum(got[x] == want[x] for x in want) / len(want))
  return _v(best == 1.0, best, f"{len(new)} new orders; best matches {best:.0%} of user, items, "
                               "shipping and address")


# -- android --------------------------------------------------------------------------------------


def check_transcript(env: Any, g: dict[str, Any], turns: V.Turns) -> V.Verdict:
  world = env.server.state.world
  if g["kind"] == "cheapest":
    return _web_cheapest(world, g, turns)
  if g["kind"] == "account":
    ok = _web_account_seen(g, turns)
    return V._v(ok, 0, f"account page of {g['user']} {'shown' if ok else 'never shown'}")
  prod = next(p for p in world["products"] if p["name"] == g["product"])
  placed = [o for _, o in turns if o.startswith('Page "Account - Shop"') and re.search(r'alert "Order #\d+ placed', o)]
  line = f"({g['product']} x {g['qty']}), {g['shipping']} to {g['address']}"
  if prod["stock"] < g["qty"]:
    bought = any(g["product"] in o for o in placed)
    refused = _web_refused(g, turns)
    return V._v(not bought and refused, 0, f"only {prod['stock']} in stock: order of it "
                                           f"{'shown' if bought else 'not shown'}, refusal {'seen' if refused else 'not seen'}")
  ok = any(line in o for o in placed)
  return V._v(ok, 0.5 if placed else 0, f"{len(placed)} order confirmations; "
                                        f"{'one' if ok else 'none'} lists {line}")


# -- android --------------------------------------------------------------------------------------
