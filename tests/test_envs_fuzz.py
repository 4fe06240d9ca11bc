"""Hostile actions in every environment end as observations, never as exceptions or hangs.

Each case was a crash, a hang or a wrong observation before: the terminal read the next commands
as a command's stdin and trusted a printed sentinel, MCP's read-only tool wrote and never stopped,
search took quadratic time in repeated terms, the desktop raised OSError and the browser
InvalidURL. After each hostile action the env must still answer a normal one correctly.
"""
import json
import os
import sqlite3
import time

import pytest

from lwm_jax.envs import ui
from lwm_jax.envs.desktop.env import DesktopEnv
from lwm_jax.envs.mcp.env import McpEnv
from lwm_jax.envs.search.env import MODULES, SearchEnv
from lwm_jax.envs.search.worlds import generate_world
from lwm_jax.envs.terminal.env import TerminalEnv
from lwm_jax.envs.web.env import WebEnv

# -- terminal --------------------------------------------------------------------------------------
PROMPT = "root@sandbox:~# " if os.geteuid() == 0 else None


@pytest.fixture(scope="module")
def term():
  env = TerminalEnv(time_limit=2.0)
  env.reset(11)
  yield env
  env.close()


def _prompt_ok(obs: str) -> bool:
  return obs.endswith(PROMPT) if PROMPT else obs.endswith("@sandbox:~$ ")


# (command, what its observation must start with) for commands that read stdin: it is empty.
STDIN_READERS = [("cat", ""), ("read x; echo rc=$?", "rc=1\n"), ("python3", ""), ("grep foo", ""),
                 ("wc -l", "0\n"), ("head -n 2", ""), ("sort", ""), ("read -r a b; echo \"[$a]\"", "[]\n"),
                 ("python3 -c 'import sys; print(len(sys.stdin.read()))'", "0\n"), ("bash", ""),
                 ("cat -", ""), ("tee out.txt", "")]


@pytest.mark.parametrize("cmd,start", STDIN_READERS)
def test_terminal_stdin_readers_see_empty_input(term, cmd, start):
  t0 = time.monotonic()
  obs = term.step(cmd)
  assert time.monotonic() - t0 < 1.5, "the command waited for input until the time limit"
  assert obs.startswith(start) and _prompt_ok(obs) and "killed" not in obs, obs
  assert term.step("echo next").startswith("next\n")


# Commands that end, kill or blind the shell: a note, a fresh shell in ~, and the env goes on.
SHELL_KILLERS = [("exit", "the shell exited with status 0"), ("exit 3", "the shell exited with status 3"),
                 ("kill -9 $$", "the shell was killed by SIGKILL"),
                 ("kill -TERM $$; sleep 1", "the shell was killed by SIGTERM"),
                 ("exec 1>/dev/null", "the command redirected the shell's output away"),
                 ("exec 2>/dev/null", "the command redirected the shell's output away"),
                 ("exec >&-", "the command redirected the shell's output away"),
                 ("exec true", "the shell exited with status 0"),
                 ("(exit 4); exit", "the shell exited with status 4")]


@pytest.mark.parametrize("cmd,note", SHELL_KILLERS)
def test_terminal_lost_shell_is_restarted_with_a_note(term, cmd, note):
  term.step(f"cd {term.layout['data']}; X=1")
  obs = term.step(cmd)
  assert f"[{note}" in obs and "a new shell was started in ~]\n" in obs and _prompt_ok(obs), obs
  # The new shell works, starts in ~ and kept no state; the sandbox's files are still there.
  log = term.layout["log"]
  obs = term.step(f"pwd; echo ${{X:-unset}}; ls {log}")
  assert obs.startswith(f"/home/user\nunset\n{log}\n") and _prompt_ok(obs), obs


FORGERIES = ["printf '__LWM_DONE_7f3a__ 0 /\\n'; echo after",
             "printf '\\n__LWM_DONE_7f3a__ 0 /tmp\\n'; echo after",
             "echo '0123456789abcdef01234567 0 0 1 /' >&87; echo after",
             "for i in 1 2 3; do echo \"$RANDOM $i 0 2 /\" >&87; done; echo after"]


@pytest.mark.parametrize("cmd", FORGERIES)
def test_terminal_sentinel_cannot_be_forged(term, cmd):
  obs = term.step(cmd)
  assert "after\n" in obs and _prompt_ok(obs), obs
  # Later observations stay in step with their commands.
  assert term.step("echo one").startswith("one\n")
  assert term.step("echo two; pwd").startswith("two\n/home/user\n")


def test_terminal_output_flood_and_binary_are_bounded(term):
  t0 = time.monotonic()
  obs = term.step("head -c 20000000 /dev/zero | tr '\\0' 'a'; echo; echo done")
  assert time.monotonic() - t0 < 10 and len(obs) < 3200 and "[output truncated" in obs
  assert term.step("echo ok").startswith("ok\n")
  assert term.step("head -c 300 /dev/urandom >/dev/null; printf '\\xff\\xfe\\n'").startswith("\ufffd\ufffd\n")


# -- search ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def search():
  env = SearchEnv()
  # A world whose collection has the json module's pages (worlds index a subset of modules).
  env.reset(next(s for s in range(1000) if "json" in generate_world(s, tuple(MODULES))["modules"]))
  yield env
  env.close()


@pytest.mark.parametrize("query", ["json " * 8000, "a" * 1_000_000, "x " * 600,
                                   " ".join(f'"{w}"' for w in ["dumps"] * 40), "json\n" * 900])
def test_search_huge_or_repeated_queries_are_fast_errors(search, query):
  t0 = time.monotonic()
  obs = search.step(f"search(query={query!r})")
  assert time.monotonic() - t0 < 2.0
  assert obs.startswith(("Error: query too long", "Error: too many search terms")), obs[:200]


@pytest.mark.parametrize("query", ["json " * 32, "dumps\x00 json", "(", "NEAR(a b)", "*", "json OR",
                                   "^json", "\"unterminated", "col:json", "é ü 漢字"])
def test_search_odd_queries_are_observations(search, query):
  t0 = time.monotonic()
  obs = search.step(f"search(query={query!r})")
  assert time.monotonic() - t0 < 2.0
  assert obs.startswith(("Results ", "No results", "Error: ")), obs[:200]
  assert search.step('search(query="dumps json")').startswith("Results 1-")


# -- desktop ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,msg", [("n" * 300, "Invalid name: 300 bytes long (at most 255)"),
                                      ("é" * 200, "Invalid name: 400 bytes long (at most 255)"),
                                      ("a\x00b", "Invalid name 'a\\x00b'"), ("..", "Invalid name '..'"),
                                      ("x/y", "Invalid name 'x/y'"), ("n" * 255, "Renamed to " + "n" * 255)])
def test_desktop_rename_with_bad_names_is_a_status_message(tmp_path, name, msg):
  env = DesktopEnv(root=str(tmp_path))
  obs = env.reset(0)
  obs = env.step(f"double_click({ui.find(obs, chr(34) + 'Documents')})")
  obs = env.step(f"click({ui.find(obs, 'listitem')})")
  obs = env.step(f"click({ui.find(obs, chr(34) + 'Rename')})")
  obs = env.step(f"type({ui.find(obs, 'textfield')}, {name!r})")
  obs = env.step(f"click({ui.find(obs, chr(34) + 'OK')})")
  assert f'statusbar "{msg}"' in obs, obs
  env.close()


# -- web -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def web():
  env = WebEnv()
  env.reset(0)
  yield env
  env.close()


@pytest.mark.parametrize("url,error", [
    ("/\r\nX-Evil: 1", "Error: invalid URL: it contains control characters '\\n', '\\r'"),
    ("/a\x00b", "Error: invalid URL: it contains control characters '\\x00'"),
    ("/cart\t", "Error: invalid URL: it contains control characters '\\t'"),
    ("/\x7f", "Error: invalid URL: it contains control characters '\\x7f'"),
    (5, "Error: url must be a string, got 5"), ("http://[::1", "Error: Invalid IPv6 URL"),
    ("//evil.example/x", "Error: cannot reach evil.example: only http://shop.local is available")])
def test_web_goto_bad_urls_are_error_observations(web, url, error):
  obs = web.step(f"goto({url!r})")
  assert obs.startswith(error + "\n") and 'Page "' in obs, obs[:200]


@pytest.mark.parametrize("url,shown", [("/products?q=a b", "/products?q=a%20b"), ("/café", "/caf%C3%A9")])
def test_web_goto_spaces_and_unicode_are_percent_encoded(web, url, shown):
  assert f"at http://shop.local{shown}" in web.step(f"goto({url!r})").splitlines()[0]


# -- mcp -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mcp():
  env = McpEnv()
  env.reset(0)
  yield env
  env.close()


def _counts(path: str) -> dict[str, int]:
  con = sqlite3.connect(path)
  try:
    return {t: con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
            for t in ("customers", "orders", "order_items", "refunds")}
  finally:
    con.close()


def _query(sql: str) -> str:
  return json.dumps({"tool": "query", "arguments": {"sql": sql}})


@pytest.mark.parametrize("sql", [
    "WITH x AS (SELECT 1) DELETE FROM order_items",
    "WITH x AS (SELECT 1) INSERT INTO refunds VALUES (999, 1.0, 'x', 'y')",
    "WITH x AS (SELECT 1) UPDATE customers SET tier = 'gold'",
    "with x as (select 1) replace into refunds values (1000, 2.0, 'r', 't')",
    "SELECT 1; DELETE FROM orders"])
def test_mcp_query_tool_cannot_write(mcp, sql):
  before = _counts(mcp.db_path)
  obs = json.loads(mcp.step(_query(sql)))
  assert obs["isError"] is True and ("readonly" in obs["content"] or "one statement" in obs["content"]), obs
  assert _counts(mcp.db_path) == before


def test_mcp_endless_query_stops_quickly_with_an_error(mcp):
  t0 = time.monotonic()
  obs = json.loads(mcp.step(_query(
      "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT COUNT(*) FROM r")))
  assert time.monotonic() - t0 < 6
  assert obs == {"isError": True, "content": "Error executing tool query: query interrupted: it ran "
                                             "longer than 2 s"}
  assert json.loads(mcp.step(_query("SELECT COUNT(*) FROM customers")))["row_count"] == 1


@pytest.mark.parametrize("args", [[1, 2], "sql", 3, True])
def test_mcp_arguments_must_be_an_object(mcp, args):
  obs = json.loads(mcp.step(json.dumps({"tool": "query", "arguments": args})))
  assert obs["error"]["code"] == -32602 and "must be a JSON object" in obs["error"]["message"]
  assert json.loads(mcp.step(json.dumps({"tool": "list_tables", "arguments": None})))[0] == "customers"
