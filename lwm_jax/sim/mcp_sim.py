"""A simulated MCP server: the world's declared tools, answered by the world model.

    python -m lwm_jax.sim.mcp_sim --checkpoint=runs/demo/sft --trajectory=EPISODES.jsonl \\
        --index=0 [--perturb="errors:rate=0.2,kind=timeout"]

speaks MCP over stdio (the `mcp` package's low-level server), so any MCP client (an agent
framework, an IDE, the `mcp` package's own client) can list the tools and call them. The tools are
those the world declares: for an `mcp` world, the tool list (name, description, input schema) in
its action space, as the real MCP environment writes it; for any other world, one tool `act`
taking the action text, described by the action space. A call becomes the action the world model
was trained on (`{"tool": NAME, "arguments": {...}}` for MCP worlds, the text for `act`) and its
result is the simulated observation; an observation the model renders as an MCP error
(`{"isError": true, ...}`) comes back as an error result.

Bad calls are MCP errors, and the server keeps serving: an unknown tool, arguments that do not
validate against the tool's input schema, or a call after the episode reached its turn limit
(`--max_turns`; reconnect for a new episode).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import threading
from typing import Any

from lwm_jax.sim.env import SimulatedEnv, World

ACT_TOOL = "act"


def declared_tools(world: World) -> list[dict[str, Any]]:
  """The tools of `world`: the JSON tool list in an MCP world's action space, else `act`."""
  if world.domain == "mcp":
    text, dec = world.action_space, json.JSONDecoder()
    at = text.find("[")
    while at != -1:
      try:
        value, _ = dec.raw_decode(text, at)
      except json.JSONDecodeError:
        value = None
      if isinstance(value, list) and value and all(
          isinstance(t, dict) and isinstance(t.get("name"), str) for t in value):
        return [{"name": t["name"], "description": t.get("description") or "",
                 "inputSchema": t.get("inputSchema") or {"type": "object", "properties": {}}}
                for t in value]
      at = text.find("[", at + 1)
  return [{"name": ACT_TOOL, "description": "Take one action in the environment. " +
           world.action_space.strip(), "inputSchema": {
               "type": "object", "properties": {"action": {"type": "string"}},
               "required": ["action"]}}]


class SimulatedTools:
  """The tool calls of one simulated episode; thread-safe (one step at a time)."""

  def __init__(self, env: SimulatedEnv, seed: int = 0):
    import jsonschema
    self.env, self.seed = env, seed
    self.tools = {t["name"]: t for t in declared_tools(env.world)}
    self.plain = list(self.tools) == [ACT_TOOL]  # no declared tool list: actions are text
    self.validators = {n: jsonschema.Draft202012Validator(t["inputSchema"])
                       for n, t in self.tools.items()}
    self.lock = threading.Lock()
    env.reset(seed)

  def action_for(self, name: str, arguments: dict[str, Any]) -> str:
    """The action text of a call; ValueError says what is wrong with it."""
    if name not in self.tools:
      raise ValueError(f"Unknown tool: {name} (declared: {', '.join(self.tools)})")
    if not isinstance(arguments, dict):
      raise ValueError(f"{name}: arguments must be an object")
    errors = sorted(self.validators[name].iter_errors(arguments), key=lambda e: list(e.path))
    if errors:
      where = "/".join(str(p) for p in errors[0].path) or "arguments"
      raise ValueError(f"{name}: invalid arguments: {where}: {errors[0].message}")
    if self.plain:
      return arguments["action"]
    return json.dumps({"tool": name, "arguments": arguments})

  def call(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
    """(observation, is_error) of one call; ValueError for a bad call or a finished episode."""
    action = self.action_for(name, arguments)
    with self.lock:
      if self.env.done:
        raise ValueError(f"the simulated episode is over ({len(self.env.turns)} turns); "
                         "reconnect to start a new one")
      obs = self.env.step_result(action).observation
    return obs, _is_error(obs)


def _is_error(observation: str) -> bool:
  try:
    value = json.loads(observation)
  except json.JSONDecodeError:
    return False
  return isinstance(value, dict) and (value.get("isError") is True or
                                      isinstance(value.get("error"), dict))


def make_server(tools: SimulatedTools) -> Any:
  """The low-level MCP server over `tools`."""
  import anyio
  import mcp_types as types
  from mcp.server.lowlevel import Server
  from mcp.shared.exceptions import MCPError

  async def list_tools(_ctx, _params) -> types.ListToolsResult:
    return types.ListToolsResult(tools=[
        types.Tool(name=t["name"], description=t["description"], input_schema=t["inputSchema"])
        for t in tools.tools.values()])

  async def call_tool(_ctx, params) -> types.CallToolResult:
    try:
      obs, is_error = await anyio.to_thread.run_sync(
          functools.partial(tools.call, params.name, params.arguments or {}))
    except ValueError as e:
      raise MCPError(types.INVALID_PARAMS, str(e)) from None
    return types.CallToolResult(content=[types.TextContent(type="text", text=obs)],
                                is_error=is_error)

  w = tools.env.world
  return Server(f"simulated-{w.domain}", instructions=f"A simulated environment. Task: {w.task}",
                get_tool_input_schema=lambda n: (tools.tools.get(n) or {}).get("inputSchema"),
                on_list_tools=list_tools, on_call_tool=call_tool)


def load_world(args: argparse.Namespace) -> World:
  from lwm_jax.data import schema
  if args.world:
    with open(args.world, encoding="utf-8") as f:
      return World.from_dict(json.load(f))
  for i, traj in enumerate(schema.read_jsonl(args.trajectory)):
    if (args.trajectory_id and traj.id == args.trajectory_id) or (
        not args.trajectory_id and i == args.index):
      return World.from_trajectory(traj)
  raise ValueError(f"{args.trajectory}: no trajectory "
                   + (f"with id '{args.trajectory_id}'" if args.trajectory_id else
                      f"at index {args.index}"))


def main(argv: list[str] | None = None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--checkpoint", required=True, help="workdir, step folder or HF folder")
  ap.add_argument("--tokenizer", default=None)
  src = ap.add_mutually_exclusive_group(required=True)
  src.add_argument("--world", help="JSON file with the World fields")
  src.add_argument("--trajectory", help="JSONL file of trajectories; see --index")
  ap.add_argument("--index", type=int, default=0)
  ap.add_argument("--trajectory_id", default="")
  ap.add_argument("--perturb", default="", help="perturbation spec, e.g. errors:rate=0.2")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--max_tokens", type=int, default=256)
  ap.add_argument("--max_turns", type=int, default=50)
  ap.add_argument("--temperature", type=float, default=0.0)
  ap.add_argument("--decode_layout", default="auto")
  args = ap.parse_args(argv)
  for name in ("max_tokens", "max_turns"):
    if getattr(args, name) < 1:
      ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
  if not os.path.exists(args.checkpoint):
    ap.error(f"--checkpoint: {args.checkpoint} does not exist")
  try:
    from lwm_jax.sim import perturb
    world = perturb.apply(load_world(args), args.perturb)
  except (ValueError, OSError, TypeError, RecursionError) as e:
    ap.error(f"{type(e).__name__}: {e}" if isinstance(e, RecursionError) else str(e))
  import anyio
  from mcp.server.stdio import stdio_server
  from lwm_jax.sampling.params import SamplingParams
  from lwm_jax.sampling.sampler import Sampler
  try:
    sampler = Sampler.from_checkpoint(args.checkpoint, tokenizer=args.tokenizer,
                                      decode_layout=args.decode_layout)
  except (ValueError, OSError) as e:  # CheckpointError is a ValueError
    ap.error(str(e))
  params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_tokens)
  tools = SimulatedTools(SimulatedEnv(sampler, world, params=params, max_turns=args.max_turns),
                         args.seed)
  server = make_server(tools)

  async def serve() -> None:
    async with stdio_server() as (read, write):
      await server.run(read, write, server.create_initialization_options())

  anyio.run(serve)


if __name__ == "__main__":
  main(sys.argv[1:])
