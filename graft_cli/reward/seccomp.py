"""The seccomp filter a sandboxed program runs under (:func:`apply_seccomp`), through libseccomp
(``libseccomp.so.2``, the library behind Docker's and systemd's filters) and ``ctypes``. A refused
call fails with EPERM (the program sees an error, not a kill). Loaded last in the sandbox's child,
before exec (:mod:`graft_cli.reward.sandbox`), into the program and all it starts."""

from __future__ import annotations

import ctypes
import errno
import os

from graft_cli.reward.confine import (CLONE_NEWCGROUP, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID,
                                      CLONE_NEWUSER, CLONE_NEWUTS, PR_SET_NO_NEW_PRIVS, libc)

# Refused always: namespaces (a user namespace gives full capabilities inside it: the surface most local privilege
# escalations need), keyrings, other processes (ptrace, their memory, their limits), mounts, kernel modules and other
# administration, io_uring (its operations bypass seccomp), SysV IPC, inotify/fanotify watches, file modes, owners
# and extended attributes (of files outside, which Landlock does not cover: a user's sandbox has no uid drop), every
# socket (no network in any configuration; stream socketpairs stay: asyncio's self-pipe), a new session (each
# program's processes stay in the session and process group it was started in; where the kernel groups scheduling
# by session, its autogroup) and CPU affinity (a program pinned to its slot's CPU stays there).
SECCOMP_DENY = ("unshare", "setns", "add_key", "request_key", "keyctl", "ptrace", "process_vm_readv",
                "process_vm_writev", "pidfd_getfd", "kcmp", "mount", "umount2", "pivot_root", "chroot", "open_tree",
                "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "bpf", "perf_event_open",
                "userfaultfd", "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
                "swapon", "swapoff", "reboot", "acct", "quotactl", "ioperm", "iopl", "io_uring_setup",
                "io_uring_enter", "io_uring_register", "shmget", "msgget", "semget", "inotify_init",
                "inotify_init1", "fanotify_init", "personality", "syslog", "lookup_dcookie", "name_to_handle_at",
                "open_by_handle_at", "setdomainname", "sethostname", "settimeofday", "clock_settime",
                "vhangup", "nfsservctl",
                "chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "lchown", "fchownat", "setxattr",
                "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr",
                "socket", "connect", "sendmsg", "sendmmsg", "setsid", "sched_setaffinity")
# Refused on another process (a non-zero pid / who: 0 is the caller itself): limits, scheduling policy, priority;
# and priority by process group or user (every process of the uid), I/O priority likewise.
SELF_ONLY = ("prlimit64", "sched_setscheduler", "sched_setparam", "sched_setattr")
# Refused where the machine gives no wall of its own (``apply_seccomp``'s arguments): timestamps where the tree
# outside the working directory is not read-only (no mount namespace; the working directory's own are refused too,
# as seccomp cannot tell paths apart), memfd where no memory cgroup holds the program (its pages are bounded by no
# address-space limit while unmapped).
UTIME = ("utime", "utimes", "futimesat", "utimensat")
PRIO_PROCESS, IOPRIO_WHO_PROCESS = 0, 1
# enum scmp_compare (seccomp.h): NE 1, LT 2, LE 3, EQ 4, GE 5, GT 6, MASKED_EQ 7
_SCMP_ACT_ALLOW, _SCMP_CMP_NE, _SCMP_CMP_MASKED_EQ = 0x7FFF0000, 1, 7
_SOCK_DGRAM, _SOCK_TYPE_MASK = 2, 0xF


def _scmp_errno(e: int) -> int:
    return 0x00050000 | (e & 0xFFFF)


class _ScmpArg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


_seccomp = None


def _libseccomp():
    global _seccomp
    if _seccomp is None:
        try:
            lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
        except OSError:
            lib = False
        if lib:
            lib.seccomp_init.restype = ctypes.c_void_p
            lib.seccomp_init.argtypes = [ctypes.c_uint32]
            lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
            lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint,
                                                   ctypes.POINTER(_ScmpArg)]
            lib.seccomp_load.argtypes = [ctypes.c_void_p]
            lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
            lib.seccomp_release.argtypes = [ctypes.c_void_p]
        _seccomp = lib
    return _seccomp


def seccomp_available() -> bool:
    return bool(_libseccomp())


def syscall_number(name: str) -> int:
    """The number of system call ``name`` on this architecture (-1: unknown here or no libseccomp)."""
    lib = _libseccomp()
    return int(lib.seccomp_syscall_resolve_name(name.encode())) if lib else -1


class _SockFprog(ctypes.Structure):  # struct sock_fprog (linux/filter.h)
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
_COMPILED: dict = {}  # (outside_read_only, memory_cgroup) -> (sock_fprog, its instructions' buffer)


def compiled_filter(outside_read_only: bool = False, memory_cgroup: bool = False) -> tuple:
    """The filter :func:`apply_seccomp` loads, compiled to BPF once per process and arguments (libseccomp's
    ``seccomp_export_bpf``): a sandbox compiles its filters before it forks, and each run's child only loads one.
    Raises OSError when libseccomp is missing or refuses a rule."""
    key = (bool(outside_read_only), bool(memory_cgroup))
    if key in _COMPILED:
        return _COMPILED[key]
    lib = _libseccomp()
    if not lib:
        raise OSError(errno.ENOSYS, "libseccomp.so.2 not found")
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError(errno.ENOMEM, "seccomp_init")
    try:
        _add_rules(lib, ctx, *key)
        code = _export_bpf(lib, ctx)
    finally:
        lib.seccomp_release(ctx)
    buf = ctypes.create_string_buffer(code, len(code))
    _COMPILED[key] = (_SockFprog(len(code) // 8, ctypes.cast(buf, ctypes.c_void_p)), buf)
    return _COMPILED[key]


def _add_rules(lib, ctx, outside_read_only: bool, memory_cgroup: bool) -> None:
    """The filter's rules (:func:`apply_seccomp`) added to libseccomp context ``ctx``."""
    eperm = _scmp_errno(errno.EPERM)

    def add(name: str, action: int, *args: _ScmpArg) -> None:
        nr = lib.seccomp_syscall_resolve_name(name.encode())
        if nr < 0:
            return  # not on this architecture
        arr = (_ScmpArg * len(args))(*args) if args else None
        rc = lib.seccomp_rule_add_array(ctx, action, nr, len(args), arr)
        if rc < 0:
            raise OSError(-rc, f"seccomp_rule_add {name}")

    def unless(arg: int, value: int) -> _ScmpArg:  # the rule matches when argument ``arg`` is not ``value``
        return _ScmpArg(arg, _SCMP_CMP_NE, value, 0)

    for name in SECCOMP_DENY + (() if outside_read_only else UTIME) + (() if memory_cgroup else ("memfd_create",)):
        add(name, eperm)
    for flag in (CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWUTS, CLONE_NEWCGROUP):
        add("clone", eperm, _ScmpArg(0, _SCMP_CMP_MASKED_EQ, flag, flag))
    add("clone3", _scmp_errno(errno.ENOSYS))
    for name in SELF_ONLY:
        add(name, eperm, unless(0, 0))
    add("setpriority", eperm, unless(0, PRIO_PROCESS))
    add("setpriority", eperm, unless(1, 0))
    add("ioprio_set", eperm, unless(0, IOPRIO_WHO_PROCESS))
    add("ioprio_set", eperm, unless(1, 0))
    add("sendto", eperm, unless(4, 0))
    add("socketpair", eperm, _ScmpArg(1, _SCMP_CMP_MASKED_EQ, _SOCK_TYPE_MASK, _SOCK_DGRAM))


def _export_bpf(lib, ctx) -> bytes:
    """The BPF program of libseccomp context ``ctx`` (``struct sock_filter`` instructions, 8 bytes each)."""
    r, w = os.pipe()
    try:
        rc = lib.seccomp_export_bpf(ctx, w)
        os.close(w)
        w = -1
        if rc < 0:
            raise OSError(-rc, "seccomp_export_bpf")
        code = b""
        while chunk := os.read(r, 65536):
            code += chunk
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    if not code or len(code) % 8:
        raise OSError(errno.EINVAL, "seccomp_export_bpf: no program")
    return code


def apply_seccomp(outside_read_only: bool = False, memory_cgroup: bool = False) -> None:
    """Load the filter into this process and its children (module constants: :data:`SECCOMP_DENY`,
    :data:`SELF_ONLY` on other processes, ``clone`` with a namespace flag, ``clone3`` (ENOSYS: libc falls back
    to ``clone``), datagram socketpairs; :data:`UTIME` unless ``outside_read_only``, ``memfd_create`` unless
    ``memory_cgroup``), compiled by :func:`compiled_filter`. Sets no_new_privs. Raises OSError when libseccomp is
    missing or the kernel refuses."""
    prog, _ = compiled_filter(outside_read_only, memory_cgroup)
    c = libc()
    if c.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl(PR_SET_NO_NEW_PRIVS): {os.strerror(e)}")
    if c.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"prctl(PR_SET_SECCOMP): {os.strerror(e)}")
