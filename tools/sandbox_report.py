"""What a sandboxed command sees of its own powers and limits, measured from inside.

  python tools/sandbox_report.py [--json OUT.json]

Starts a terminal episode and, from its shell, reads /proc/self/status (uids, capability sets,
NoNewPrivs, seccomp), the uid map, `ulimit -a`, the cgroup memory and pids limits (from the
host: the sandbox's own cgroup view is namespaced), the sizes of /sandbox and /tmp, and whether
/usr, /etc and / are mounted read-only; prints them and optionally writes them as JSON.
"""
from __future__ import annotations

import argparse
import json
import os


from lwm_jax.envs import sandbox
from lwm_jax.envs.terminal.env import TerminalEnv


def _cgroup_limits(pid: int) -> dict[str, str]:
  out = {}
  with open(f"/proc/{pid}/cgroup") as f:
    for line in f:
      _, ctrl, path = line.rstrip("\n").split(":", 2)
      for c, files in (("memory", ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes",
                                   "memory.max", "memory.swap.max")),
                       ("pids", ("pids.max",)), ("", ("memory.max", "pids.max"))):
        if ctrl != c:
          continue
        base = f"/sys/fs/cgroup/{c}" if c else "/sys/fs/cgroup"
        for name in files:
          p = os.path.join(base + path, name)
          if os.path.exists(p):
            out[f"{c or 'v2'}:{path}/{name}"] = open(p).read().strip()
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--json", default="")
  args = ap.parse_args()
  report: dict = {"host_euid": os.geteuid(), "describe": sandbox.describe()}
  if not sandbox.available():
    print(json.dumps(report, indent=1))
    return
  env = TerminalEnv(time_limit=10.0)
  env.reset(0)
  try:
    def sh(cmd: str) -> str:
      out = env.step(cmd)
      return out[:out.rfind("\n") + 1] if "\n" in out else ""
    report["status"] = {l.split(":")[0]: l.split(":", 1)[1].strip() for l in sh(
        "grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp|"
        "Seccomp_filters):' /proc/self/status").splitlines() if ":" in l}
    report["id"] = sh("id").strip()
    report["uid_map"] = " ".join(sh("cat /proc/self/uid_map").split())
    report["ulimit"] = sh("ulimit -a").strip().splitlines()
    report["disk"] = sh("df -k /sandbox /tmp | tail -n +2").strip().splitlines()
    report["read_only_mounts"] = sh("awk '$2==\"/\"||$2==\"/usr\"||$2==\"/etc/passwd\"||$2==\"/proc/sys\" "
                                    "{print $2, substr($4,1,2)}' /proc/self/mounts").strip().splitlines()
    report["sys_visible"] = os.path.basename(sh("ls -d /sys 2>&1").strip()) == "sys"
    report["host_view_of_shell"] = {"pid": env.shell_pid}
    with open(f"/proc/{env.shell_pid}/status") as f:
      report["host_view_of_shell"]["Uid"] = next(l for l in f if l.startswith("Uid:")).split()[1:]
    report["host_view_of_shell"]["cgroups"] = _cgroup_limits(env.shell_pid)
  finally:
    env.close()
  text = json.dumps(report, indent=1)
  print(text)
  if args.json:
    with open(args.json, "w") as f:
      f.write(text + "\n")


if __name__ == "__main__":
  main()
