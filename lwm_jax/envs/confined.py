"""The host's access to an episode's files, confined to the episode directory.

The agent owns everything under its episode directory and may swap any file or folder for a
symbolic link (to a host file, to /dev/zero), a FIFO or a device while the host looks. So the
host never resolves a path by name: it walks from the episode root one component at a time with
`openat(O_NOFOLLOW)`, opens files with O_NONBLOCK (a FIFO's open cannot wait for a writer), uses
what it opened only when `fstat` calls it a regular file (or a directory), and reads at most
`max_bytes`. Changes (times, owners) go through the same descriptors, never through a name that
could have been swapped since it was checked.
"""
from __future__ import annotations

import hashlib
import os
import posixpath
import stat

MAX_READ = 8 << 20   # bytes; a file larger than this is refused rather than read in part
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class Refused(OSError):
  """A path the host will not use: outside the root, through a link, or not a regular file."""


def parts(rel: str) -> list[str]:
  """The components of `rel` below the root; raises Refused when it leaves the root."""
  if not isinstance(rel, str) or "\0" in rel:
    raise Refused(f"bad path {rel!r}")
  norm = posixpath.normpath(rel.lstrip("/")) if rel.strip("/") else "."
  if norm == ".":
    return []
  if norm == ".." or norm.startswith("../"):
    raise Refused(f"path '{rel}' is outside the directory")
  return norm.split("/")


def _open_dir_fd(root: str, names: list[str]) -> int:
  fd = os.open(root, _DIR_FLAGS)
  try:
    for name in names:
      nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
      os.close(fd)
      fd = nxt
  except OSError as e:
    os.close(fd)
    if e.errno in (20, 40):  # ENOTDIR, ELOOP: a file or a link where a folder was expected
      raise Refused(f"'{'/'.join(names)}' is not a folder of the episode") from None
    raise
  return fd


def kind(root: str, rel: str) -> str | None:
  """'file', 'dir', 'link', 'other' (FIFO, socket, device) or None (missing) for `rel`, without
  following any link on the way."""
  names = parts(rel)
  if not names:
    return "dir"
  try:
    fd = _open_dir_fd(root, names[:-1])
  except (FileNotFoundError, Refused):
    return None
  try:
    st = os.stat(names[-1], dir_fd=fd, follow_symlinks=False)
  except FileNotFoundError:
    return None
  finally:
    os.close(fd)
  if stat.S_ISREG(st.st_mode):
    return "file"
  if stat.S_ISDIR(st.st_mode):
    return "dir"
  return "link" if stat.S_ISLNK(st.st_mode) else "other"


def open_file(root: str, rel: str, flags: int = os.O_RDONLY) -> int:
  """A descriptor of the regular file `rel` under `root` (no link followed, no FIFO waited on).

  Raises FileNotFoundError when it is missing and Refused when it is anything but a regular file.
  """
  names = parts(rel)
  if not names:
    raise Refused(f"'{rel}' is a folder")
  dfd = _open_dir_fd(root, names[:-1])
  try:
    fd = os.open(names[-1], flags | _FILE_FLAGS, dir_fd=dfd)
  except OSError as e:
    if e.errno == 40:  # ELOOP: the last component is a symbolic link
      raise Refused(f"'{rel}' is a symbolic link; the host does not follow links") from None
    if e.errno == 21:  # EISDIR
      raise Refused(f"'{rel}' is a folder") from None
    raise
  finally:
    os.close(dfd)
  st = os.fstat(fd)
  if not stat.S_ISREG(st.st_mode):
    os.close(fd)
    raise Refused(f"'{rel}' is not a regular file")
  os.set_blocking(fd, True)
  return fd


def read_bytes(root: str, rel: str, max_bytes: int = MAX_READ) -> bytes:
  """The content of regular file `rel`; Refused when it holds more than `max_bytes`."""
  fd = open_file(root, rel)
  try:
    if os.fstat(fd).st_size > max_bytes:
      raise Refused(f"'{rel}' is larger than {max_bytes} bytes")
    chunks, size = [], 0
    while True:
      chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
      if not chunk:
        break
      chunks.append(chunk)
      size += len(chunk)
      if size > max_bytes:
        raise Refused(f"'{rel}' is larger than {max_bytes} bytes")
    return b"".join(chunks)
  finally:
    os.close(fd)


def read_text(root: str, rel: str, max_bytes: int = MAX_READ) -> str | None:
  """`read_bytes` decoded (bad bytes replaced), or None when `rel` is missing or refused."""
  try:
    return read_bytes(root, rel, max_bytes).decode("utf-8", "replace")
  except OSError:
    return None


def write_text(root: str, rel: str, text: str) -> None:
  """Replaces the content of the existing regular file `rel` (no link followed)."""
  fd = open_file(root, rel, os.O_WRONLY)
  try:
    os.ftruncate(fd, 0)
    data = text.encode()
    while data:
      data = data[os.write(fd, data):]
  finally:
    os.close(fd)


def listdir(root: str, rel: str) -> list[tuple[str, str]]:
  """(name, 'dir'|'file'|'link'|'other') of folder `rel`, sorted by name; no link followed."""
  fd = _open_dir_fd(root, parts(rel))
  out = []
  try:
    with os.scandir(fd) as it:
      for e in it:
        try:
          st = e.stat(follow_symlinks=False)
        except FileNotFoundError:
          continue
        out.append((e.name, "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode)
                    else "link" if stat.S_ISLNK(st.st_mode) else "other"))
  finally:
    os.close(fd)
  return sorted(out)


def walk(root: str, max_entries: int = 100_000, max_depth: int = 64):
  """(folder descriptor, names in it) for `root` and the folders below it, each opened with
  O_NOFOLLOW|O_DIRECTORY relative to its parent (a folder swapped for a link is not entered),
  stopping after `max_entries` names or below `max_depth` levels."""
  budget = [max_entries]

  def visit(fd: int, depth: int):
    names, subdirs = [], []
    try:
      with os.scandir(fd) as it:
        for e in it:
          names.append(e.name)
          try:
            if e.is_dir(follow_symlinks=False):
              subdirs.append(e.name)
          except OSError:
            pass
    except OSError:
      return
    budget[0] -= len(names)
    yield fd, names
    if depth >= max_depth:
      return
    for name in subdirs:
      if budget[0] <= 0:
        return
      try:
        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
      except OSError:
        continue
      try:
        yield from visit(sub, depth + 1)
      finally:
        os.close(sub)

  top = os.open(root, _DIR_FLAGS)
  try:
    yield from visit(top, 0)
  finally:
    os.close(top)


def chown_tree(root: str, uid: int, gid: int) -> None:
  """Gives everything under `root` (and `root`) to uid:gid; links themselves, never targets."""
  os.chown(root, uid, gid, follow_symlinks=False)
  for dirfd, names in walk(root):
    for name in names:
      try:
        os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
      except FileNotFoundError:
        pass


def stamp_tree(root: str, stamp: float, newer_than: float | None = None,
               max_entries: int = 100_000) -> None:
  """Sets the mtime and atime of every entry under `root` (and of `root`) to `stamp`, or only of
  those modified after `newer_than`; links themselves, never their targets. Entries that vanish
  meanwhile are passed over."""
  def fix(name, dirfd):
    try:
      st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
      if newer_than is None or st.st_mtime > newer_than:
        os.utime(name, (stamp, stamp), dir_fd=dirfd, follow_symlinks=False)
    except OSError:
      pass
  for dirfd, names in walk(root, max_entries):
    for name in names:
      fix(name, dirfd)
    try:  # the folder itself, through its descriptor (its entries' changes moved its mtime)
      st = os.fstat(dirfd)
      if newer_than is None or st.st_mtime > newer_than:
        os.utime(dirfd, (stamp, stamp))
    except OSError:
      pass


def tree_digest(root: str, skip: tuple[str, ...] = (), max_entries: int = 100_000,
                max_bytes: int = MAX_READ) -> str:
  """A sha256 over every entry under `root`: relative path, kind, mode bits, and a regular file's
  bytes (its first `max_bytes` and its size) or a link's target; folders named in `skip` are not
  entered. Equal exactly when nothing under `root` changed but times. Links are never followed."""
  h = hashlib.sha256()
  budget = [max_entries]

  def visit(fd: int, rel: str) -> None:
    try:
      with os.scandir(fd) as it:
        names = sorted(e.name for e in it)
    except OSError:
      return
    budget[0] -= len(names)
    for name in names:
      path = f"{rel}/{name}" if rel else name
      try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
      except OSError:
        continue
      h.update(f"\0{path}\0{stat.S_IFMT(st.st_mode)}\0{stat.S_IMODE(st.st_mode)}\0{st.st_size}\0".encode(
          "utf-8", "surrogateescape"))
      if stat.S_ISLNK(st.st_mode):
        h.update(os.readlink(name, dir_fd=fd).encode("utf-8", "surrogateescape"))
      elif stat.S_ISREG(st.st_mode):
        try:
          f = os.open(name, os.O_RDONLY | _FILE_FLAGS, dir_fd=fd)
        except OSError:
          continue
        with os.fdopen(f, "rb") as fh:
          if stat.S_ISREG(os.fstat(f).st_mode):  # not swapped for a FIFO or device meanwhile
            h.update(fh.read(max_bytes))
      elif stat.S_ISDIR(st.st_mode) and name not in skip and budget[0] > 0:
        try:
          sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
          continue
        try:
          visit(sub, path)
        finally:
          os.close(sub)

  top = os.open(root, _DIR_FLAGS)
  try:
    visit(top, "")
  finally:
    os.close(top)
  return h.hexdigest()
