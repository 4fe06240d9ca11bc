"""The simulated MCP server: the world's declared tools, answered by the world model; checked with
the `mcp` package's own client over stdio on a tiny random checkpoint, and in process with a
scripted world model for exactly what the model is asked."""
from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

import lwm_jax
from lwm_jax.data.bench_records import format_action
from lwm_jax.sampling import Generation
from lwm_jax.sim.env import SimulatedEnv, World
from lwm_jax.sim.mcp_sim import ACT_TOOL, SimulatedTools, declared_tools
from tests.sim_helpers import save_tiny_checkpoint, terminal_world

TOOLS = [
    {"name": "get_customer", "description": "Returns one customer by id.",
     "inputSchema": {"type": "object", "properties": {"customer_id": {"type": "integer"}},
                     "required": ["customer_id"]}},
    {"name": "list_tables", "description": "Lists the tables.",
     "inputSchema": {"type": "object", "properties": {}}},
]


def mcp_world() -> World:
  # The action space as the real MCP environment writes it.
  return World("mcp", "Find customer 1's email.",
               "Call one tool per turn as a JSON object {\"tool\": NAME, \"arguments\": {...}}. "
               "Available tools (MCP tools/list):\n" + json.dumps(TOOLS, indent=1),
               "Connected to MCP server 'shop-db'.")


class Scripted:
  def __init__(self, replies):
    self.replies, self.prompts = list(replies), []

  def generate(self, chats, params):
    self.prompts.extend(chats)
    return [Generation(text=f"<think>x</think><predicted_observation>{self.replies.pop(0)}"
                            "</predicted_observation>", token_ids=[], logprobs=[],
                       finish_reason="stop") for _ in chats]


def test_declared_tools_and_calls_in_process():
  assert [t["name"] for t in declared_tools(mcp_world())] == ["get_customer", "list_tables"]
  assert [t["name"] for t in declared_tools(terminal_world())] == [ACT_TOOL]
  wm = Scripted(['{"id": 1, "email": "a@b.c"}', '{"isError": true, "content": "no such table"}'])
  tools = SimulatedTools(SimulatedEnv(wm, mcp_world(), max_turns=5))
  obs, err = tools.call("get_customer", {"customer_id": 1})
  assert (obs, err) == ('{"id": 1, "email": "a@b.c"}', False)
  # The world model was asked for the observation of the real environment's action format.
  assert wm.prompts[0][-1]["content"] == format_action(
      1, json.dumps({"tool": "get_customer", "arguments": {"customer_id": 1}}))
  assert tools.call("list_tables", {})[1] is True
  with pytest.raises(ValueError, match="Unknown tool: drop_all"):
    tools.call("drop_all", {})
  with pytest.raises(ValueError, match="customer_id: 'x' is not of type 'integer'"):
    tools.call("get_customer", {"customer_id": "x"})
  with pytest.raises(ValueError, match="'customer_id' is a required property"):
    tools.call("get_customer", {})
  assert len(tools.env.turns) == 2  # bad calls never reached the world model
  plain = SimulatedTools(SimulatedEnv(Scripted(["a.txt"]), terminal_world(), max_turns=1))
  assert plain.call(ACT_TOOL, {"action": "ls"}) == ("a.txt", False)
  assert plain.env.turns[0].action == "ls"
  with pytest.raises(ValueError, match="episode is over"):
    plain.call(ACT_TOOL, {"action": "ls"})


@pytest.mark.slow  # heavy: `make test-slow` (CI runs it after `make test`) keeps `make test` under 8 minutes
def test_mcp_client_over_stdio_lists_calls_and_gets_errors(tmp_path):
  from mcp.client.session import ClientSession
  from mcp.client.stdio import StdioServerParameters, stdio_client
  from mcp.shared.exceptions import MCPError
  ckpt = save_tiny_checkpoint(str(tmp_path / "ckpt"))
  world_file = tmp_path / "world.json"
  world_file.write_text(json.dumps(mcp_world().to_dict()))
  params = StdioServerParameters(
      command=sys.executable,
      args=["-m", "lwm_jax.sim.mcp_sim", "--checkpoint", ckpt, "--world", str(world_file),
            "--max_tokens", "4", "--decode_layout", "model",
            "--perturb", "errors:rate=0.5,kind=timeout"],
      env={**os.environ, "PYTHONPATH": lwm_jax.child_pythonpath()})

  async def session():
    with open(tmp_path / "server.log", "w") as errlog:
      async with stdio_client(params, errlog=errlog) as (r, w):
        async with ClientSession(r, w) as s:
          await s.initialize()
          listed = await s.list_tools()
          out = {"tools": {t.name: t.input_schema for t in listed.tools}}
          res = await s.call_tool("get_customer", {"customer_id": 1})
          out["result"] = (res.content[0].type, res.content[0].text)
          for bad in [("drop_all", {}), ("get_customer", {"customer_id": "one"})]:
            try:
              await s.call_tool(*bad)
              out.setdefault("errors", []).append(None)
            except MCPError as e:
              out.setdefault("errors", []).append(e.message)
          again = await s.call_tool("list_tables", {})  # still serving
          out["again"] = again.content[0].type
          return out

  out = asyncio.run(asyncio.wait_for(session(), 120))
  assert out["tools"] == {t["name"]: t["inputSchema"] for t in TOOLS}
  kind, text = out["result"]
  assert kind == "text" and isinstance(text, str)
  assert out["errors"][0].startswith("Unknown tool: drop_all")
  assert "'one' is not of type 'integer'" in out["errors"][1]
  assert out["again"] == "text"


def test_a_generated_mcp_world_serves_the_real_declared_tools():
  from lwm_jax.envs import base
  env = base.make_env("mcp")
  try:
    world = World.from_env(env, seed=4)
    tools = declared_tools(world)
    # Reference: the tools the real environment declared to the agent in that episode.
    assert [t["name"] for t in tools] == [t["name"] for t in env.tools]
    assert [t["inputSchema"] for t in tools] == [t["inputSchema"] for t in env.tools]
    assert world.task == env.goal["text"]
  finally:
    env.close()
