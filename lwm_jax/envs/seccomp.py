"""A seccomp filter for the sandbox, compiled here to classic BPF (what `bwrap --seccomp FD` loads).

The program refuses (EPERM) the system calls a sandboxed command has no use for and that would
reach the kernel's more delicate surfaces: mounting and namespace changes, tracing other
processes, the kernel keyring, module and kexec loading, BPF and perf, raw I/O ports, clock and
swap changes, handle-based opens, `ioctl(TIOCSTI/TIOCLINUX)` (typing into a terminal), and a
`clone` that asks for a new namespace. `clone3` answers ENOSYS, so the C library falls back to
`clone`, whose flags the filter can read. A call made with another architecture's calling
convention (i386 or x32 on x86_64, arm32 on aarch64) kills the process: the numbers below only
hold for the native table.

Only x86_64 and aarch64 are known; `program()` returns None elsewhere and the sandbox says so.
"""
from __future__ import annotations

import errno
import os
import platform
import struct

# struct seccomp_data: int nr; u32 arch; u64 instruction_pointer; u64 args[6].
_NR, _ARCH, _ARG0 = 0, 4, 16
# Classic BPF opcodes.
_LD_W_ABS = 0x20          # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15             # BPF_JMP | BPF_JEQ | BPF_K
_JSET_K = 0x45            # BPF_JMP | BPF_JSET | BPF_K
_JGE_K = 0x35             # BPF_JMP | BPF_JGE | BPF_K
_RET_K = 0x06             # BPF_RET | BPF_K
RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000

_CLONE_NS_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000
                   | 0x40000000 | 0x00000080)  # NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C

# Refused calls, by name; each architecture's numbers follow.
REFUSED = ("mount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount", "fsopen",
           "fsconfig", "fsmount", "fspick", "mount_setattr", "unshare", "setns", "ptrace",
           "process_vm_readv", "process_vm_writev", "keyctl", "add_key", "request_key",
           "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
           "reboot", "swapon", "swapoff", "bpf", "perf_event_open", "userfaultfd", "acct",
           "quotactl", "syslog", "open_by_handle_at", "name_to_handle_at", "settimeofday",
           "clock_settime", "clock_adjtime", "adjtimex", "sethostname", "setdomainname", "vhangup",
           "lookup_dcookie", "iopl", "ioperm", "uselib")

_ARCHES = {
    # AUDIT_ARCH value, the x32 bit to refuse (or 0), syscall numbers.
    "x86_64": (0xC000003E, 0x40000000, {
        "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272,
        "setns": 308, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
        "keyctl": 250, "add_key": 248, "request_key": 249, "kexec_load": 246,
        "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "reboot": 169, "swapon": 167, "swapoff": 168, "bpf": 321, "perf_event_open": 298,
        "userfaultfd": 323, "acct": 163, "quotactl": 179, "syslog": 103,
        "open_by_handle_at": 304, "name_to_handle_at": 303, "settimeofday": 164,
        "clock_settime": 227, "clock_adjtime": 305, "adjtimex": 159, "sethostname": 170,
        "setdomainname": 171, "vhangup": 153, "lookup_dcookie": 212, "iopl": 172, "ioperm": 173,
        "uselib": 134, "ioctl": 16, "clone": 56, "clone3": 435}),
    "aarch64": (0xC00000B7, 0, {
        "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "keyctl": 219,
        "add_key": 217, "request_key": 218, "kexec_load": 104, "kexec_file_load": 294,
        "init_module": 105, "finit_module": 273, "delete_module": 106, "reboot": 142,
        "swapon": 224, "swapoff": 225, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "acct": 89, "quotactl": 60, "syslog": 116, "open_by_handle_at": 265,
        "name_to_handle_at": 264, "settimeofday": 170, "clock_settime": 112,
        "clock_adjtime": 266, "adjtimex": 171, "sethostname": 161, "setdomainname": 162,
        "vhangup": 58, "lookup_dcookie": 18, "ioctl": 29, "clone": 220, "clone3": 435}),
}
# The new mount API has the same numbers on every architecture.
for _table in _ARCHES.values():
  _table[2].update({"open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
                    "fsmount": 432, "fspick": 433, "mount_setattr": 442})


def _ins(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
  return struct.pack("=HBBI", code, jt, jf, k)


def program(machine: str | None = None) -> bytes | None:
  """The filter for this machine's architecture as bytes of `struct sock_filter`, or None."""
  machine = machine or platform.machine()
  if machine == "arm64":
    machine = "aarch64"
  if machine not in _ARCHES:
    return None
  arch, x32_bit, nrs = _ARCHES[machine]
  eperm = RET_ERRNO | errno.EPERM
  out = [_ins(_LD_W_ABS, _ARCH),
         _ins(_JEQ_K, arch, jt=1),
         _ins(_RET_K, RET_KILL_PROCESS),
         _ins(_LD_W_ABS, _NR)]
  if x32_bit:
    out += [_ins(_JGE_K, x32_bit, jf=1), _ins(_RET_K, RET_KILL_PROCESS)]
  for name in REFUSED:
    out += [_ins(_JEQ_K, nrs[name], jf=1), _ins(_RET_K, eperm)]
  out += [_ins(_JEQ_K, nrs["clone3"], jf=1), _ins(_RET_K, RET_ERRNO | errno.ENOSYS)]
  # clone(flags, ...): refuse any namespace flag (flags is the first argument on both arches;
  # the namespace bits all sit in its low 32 bits).
  out += [_ins(_JEQ_K, nrs["clone"], jf=3), _ins(_LD_W_ABS, _ARG0),
          _ins(_JSET_K, _CLONE_NS_FLAGS, jf=1), _ins(_RET_K, eperm), _ins(_LD_W_ABS, _NR)]
  # ioctl(fd, request, ...): refuse the two requests that inject input into a terminal.
  # (The kernel compares request as a 32-bit value, so the low word is enough.)
  out += [_ins(_JEQ_K, nrs["ioctl"], jf=4), _ins(_LD_W_ABS, _ARG0 + 8),
          _ins(_JEQ_K, _TIOCSTI, jt=1), _ins(_JEQ_K, _TIOCLINUX, jf=1), _ins(_RET_K, eperm)]
  out.append(_ins(_RET_K, RET_ALLOW))
  if len(out) > 4096:  # BPF_MAXINSNS
    raise AssertionError("seccomp program too long")
  return b"".join(out)


def program_fd(machine: str | None = None) -> int:
  """A file descriptor (at offset 0) holding `program()`, for `bwrap --seccomp FD`; -1 if none."""
  prog = program(machine)
  if prog is None:
    return -1
  fd = os.memfd_create("lwm_seccomp", 0) if hasattr(os, "memfd_create") else -1
  if fd < 0:
    raise OSError("memfd_create is unavailable")
  os.write(fd, prog)
  os.lseek(fd, 0, os.SEEK_SET)
  return fd
