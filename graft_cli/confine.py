"""The kernel's confinement primitives the sandbox (:mod:`graft_cli.sandbox`) applies in its child: Landlock
rulesets through ``ctypes`` (file access, TCP, signals), resource limits, a pids cgroup per slot, and the process
bookkeeping that finds and kills what a program left behind. Each is best effort; the sandbox records which held.
"""

from __future__ import annotations

import ctypes
import errno
import math
import os
import resource
import signal
import stat
import sys
import time

_libc = None


def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 4, 24, 38, 36
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 16384, 1 << 18

# Landlock (include/uapi/linux/landlock.h); the three syscalls have the same numbers on every architecture
_LL_CREATE, _LL_ADD_RULE, _LL_RESTRICT = 444, 445, 446
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1, 2, 4, 8
_FS_WRITE_DIR = sum(1 << i for i in range(4, 13))  # REMOVE_DIR ... MAKE_SYM
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1, 2
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: none or disabled)."""
    try:
        r = libc().syscall(_LL_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except Exception:
        return 0
    return max(0, int(r))


def _fs_rights(abi: int) -> int:
    r = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_READ_DIR | _FS_WRITE_DIR
    if abi >= 2:
        r |= FS_REFER
    if abi >= 3:
        r |= FS_TRUNCATE
    if abi >= 5:
        r |= FS_IOCTL_DEV
    return r


def apply_landlock(workdir: str, read_roots: list[str] | None) -> None:
    """Restrict this process (and its children) with Landlock; raises OSError when the kernel refuses.
    ``read_roots`` None: reads stay unrestricted (only writes, TCP and signals are handled)."""
    abi = landlock_abi()
    if abi < 1:
        raise OSError(errno.EOPNOTSUPP, "landlock unavailable")
    every = _fs_rights(abi)
    read = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
    handled = every if read_roots is not None else every & ~read
    attr = _RulesetAttr(handled, (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0,
                        (SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL) if abi >= 6 else 0)
    c = libc()
    fd = c.syscall(_LL_CREATE, ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")

    def allow(path: str, rights: int) -> None:
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            if not stat.S_ISDIR(os.fstat(pfd).st_mode):
                rights &= _FILE_RIGHTS
            rule = _PathBeneath(rights & handled, pfd)
            if rule.allowed and c.syscall(_LL_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(1), ctypes.byref(rule),
                                          ctypes.c_uint32(0)) < 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
        finally:
            os.close(pfd)

    try:
        allow(workdir, every)
        allow("/dev/null", FS_READ_FILE | FS_WRITE_FILE)
        for p in read_roots or ():
            allow(p, read)
        if read_roots is not None:  # its own /proc entry only: no other process's environ, cmdline or memory
            allow(f"/proc/{os.getpid()}", read)
        if c.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
        if c.syscall(_LL_RESTRICT, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(fd)


def read_roots() -> list[str]:
    """What a sandboxed Python may read under ``landlock_read``: its installation and the system directories."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(sys.executable)}
    roots |= {p for p in sys.path if p and os.path.isdir(p) and not p.startswith(os.getcwd())}
    roots |= {"/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys", "/dev"}
    return sorted(p for p in roots if p and os.path.exists(p))


def apply_rlimits(lim, nproc_limit: int | None) -> None:
    """``setrlimit`` soft = hard for the limits of ``lim`` (a :class:`graft_cli.sandbox.Limits`): address space, CPU
    seconds, open files, file size, no core files, and processes when ``nproc_limit`` is set."""

    def cap(which, value):
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            _, hard = resource.getrlimit(which)
            if hard != resource.RLIM_INFINITY:
                resource.setrlimit(which, (min(value, hard), min(value, hard)))

    cap(resource.RLIMIT_AS, int(lim.memory_mb) << 20)
    cpu = lim.cpu_s if lim.cpu_s is not None else math.ceil(lim.timeout_s) + 1
    cap(resource.RLIMIT_CPU, int(cpu))
    cap(resource.RLIMIT_NOFILE, int(lim.nofile))
    cap(resource.RLIMIT_FSIZE, int(lim.fsize_mb) << 20)
    cap(resource.RLIMIT_CORE, 0)
    if nproc_limit is not None:
        cap(resource.RLIMIT_NPROC, int(nproc_limit))


def tasks_of_uid(uid: int) -> int:
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                n += len(os.listdir(f"/proc/{pid}/task"))
        except OSError:
            pass
    return n


def children(pid: int) -> list[int]:
    out = []
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            out = [int(x) for x in f.read().split()]
    except OSError:
        for p in os.listdir("/proc"):
            if p.isdigit():
                try:
                    with open(f"/proc/{p}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                            out.append(int(p))
                except (OSError, ValueError, IndexError):
                    pass
    return out


def kill_each(pids) -> int:
    """SIGKILL each pid; how many signals were delivered."""
    n = 0
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
            n += 1
        except OSError:
            pass
    return n


class Cgroup:
    """A pids cgroup of one sandbox slot (v2 under the caller's own cgroup, else a writable v1 ``pids``)."""

    def __init__(self, name: str, nproc: int):
        self.path = None
        for base in self._bases():
            path = os.path.join(base, name)
            try:
                os.makedirs(path, exist_ok=True)
                with open(os.path.join(path, "pids.max"), "w") as f:
                    f.write(str(int(nproc)))
                self.path = path
                return
            except OSError:
                try:
                    os.rmdir(path)
                except OSError:
                    pass

    @staticmethod
    def _bases() -> list[str]:
        out = []
        try:
            with open("/proc/self/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            return out
        for line in lines:
            hid, ctrls, path = (line.split(":", 2) + ["", ""])[:3]
            if hid == "0" and not ctrls and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
                out.append("/sys/fs/cgroup" + path.rstrip("/"))
            elif "pids" in ctrls.split(","):
                out.append("/sys/fs/cgroup/pids" + path.rstrip("/"))
        return out

    def join(self) -> None:
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def pids(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def kill_all(self, limit_s: float = 5.0) -> int:
        killed, deadline = 0, time.monotonic() + limit_s
        kill_file = os.path.join(self.path, "cgroup.kill")
        while time.monotonic() < deadline:
            pids = self.pids()
            if not pids:
                break
            if os.path.exists(kill_file):
                try:
                    with open(kill_file, "w") as f:
                        f.write("1")
                except OSError:
                    pass
            killed += kill_each(pids)
            time.sleep(0.005)
        return killed

    def remove(self) -> None:
        if self.path:
            self.kill_all(1.0)
            try:
                os.rmdir(self.path)
            except OSError:
                pass
