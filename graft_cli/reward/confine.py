"""The kernel's confinement primitives the sandbox (:mod:`graft_cli.reward.sandbox`) applies in its child: Landlock
rulesets through ``ctypes`` (file access, TCP, signals), resource limits, a pids / cpu / memory cgroup per slot, the
mounts of the sandbox's own mount namespace, and the process bookkeeping that finds and kills what a program left
behind (the seccomp filter: :mod:`graft_cli.reward.seccomp`). Each is best effort; the sandbox records which held.
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
import tempfile
import time

_libc = None


def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc


PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_CHILD_SUBREAPER = 1, 4, 24, 38, 36
CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
CLONE_NEWIPC, CLONE_NEWPID, CLONE_NEWUTS, CLONE_NEWCGROUP, CLONE_NEWTIME = 0x08000000, 0x20000000, 0x04000000, \
    0x02000000, 0x00000080
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18

# ------------------------------------------------------------------------------------------------------- mounts
EMPTIED = ("/tmp", "/run", "/var/tmp", "/dev/shm", "/home", "/root")
DEVICES = ("/dev/null", "/dev/zero", "/dev/random", "/dev/urandom")  # the device nodes a program may open
_MOUNT_SETATTR, MOUNT_ATTR_RDONLY, AT_RECURSIVE = 442, 0x1, 0x8000  # one number on every architecture


def _mount(src, target: str, fstype, flags: int, data) -> None:
    enc = lambda x: x.encode() if isinstance(x, str) else x  # noqa: E731
    if libc().mount(enc(src), target.encode(), enc(fstype), flags, enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {target}: {os.strerror(e)}")


def _read_only_tree() -> bool:
    """Every mount of this mount namespace made read-only (``mount_setattr`` with ``AT_RECURSIVE``, Linux >= 5.12):
    nothing outside what is mounted afterwards (the scratch tmpfs) can be written, touched (timestamps) or have its
    mode changed, whoever the program runs as. False where the kernel refuses."""
    attr = (ctypes.c_uint64 * 4)(MOUNT_ATTR_RDONLY, 0, 0, 0)
    r = libc().syscall(_MOUNT_SETATTR, ctypes.c_int(-100), b"/", ctypes.c_uint(AT_RECURSIVE), ctypes.byref(attr),
                       ctypes.c_size_t(32))
    return r == 0


def _device_nodes() -> None:
    """An empty tmpfs over ``/dev`` holding only :data:`DEVICES` (bound from the machine's), ``/dev/fd``,
    ``/dev/stdin``/``stdout``/``stderr`` and an empty ``/dev/shm``: no terminal, shared memory or other node of
    the machine. Raises OSError."""
    holds = {d: os.open(d, os.O_PATH | os.O_CLOEXEC) for d in DEVICES if os.path.exists(d)}
    try:
        _mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755")
        for d, fd in holds.items():
            os.close(os.open(d, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o666))
            _mount(f"/proc/self/fd/{fd}", d, None, MS_BIND, None)
    finally:
        for fd in holds.values():
            os.close(fd)
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", f"/dev/{name}")
    os.symlink("/proc/self/fd", "/dev/fd")
    os.mkdir("/dev/shm", 0o1777)


def private_mounts(workdir: str, keep: list[str], tmpfs_mb: int, inodes: int, owner: int | None,
                   new_proc: bool, covers: tuple = ()) -> bool:
    """In a fresh mount namespace: every mount made read-only (:func:`_read_only_tree`), ``/dev`` with
    :data:`DEVICES` only (:func:`_device_nodes`), empty size- and inode-capped tmpfs over :data:`EMPTIED` (the paths
    of ``keep`` below any of them - the Python installation, e.g. a venv under ``/root`` or in a checkout under
    ``/tmp`` - bound back read-only, so a sandbox uid can still run that Python), an empty read-only tmpfs over each
    directory of ``covers`` (site-packages, the checkout: :func:`answer_view`), ``workdir`` created inside the new
    ``/tmp`` (owned by ``owner``), and with ``new_proc`` a procfs of the new PID namespace over ``/proc``. Returns
    whether the tree outside is read-only; raises OSError."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    holds = {}
    for path in keep:  # opened before they are covered
        if any(path.startswith(d + "/") for d in EMPTIED) and os.path.isdir(path):
            holds[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
    read_only = _read_only_tree()
    try:
        _device_nodes()
        for d in EMPTIED:
            if not os.path.isdir(d) or os.path.islink(d):
                continue
            scratch = d == "/tmp"
            mode = "1777" if d in ("/tmp", "/var/tmp", "/dev/shm") else "0755"
            _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(tmpfs_mb) if scratch else 1}m,"
                   f"nr_inodes={int(inodes) if scratch else 64},mode={mode}")
        for path in sorted(holds, key=len):
            if any(path.startswith(q + "/") for q in holds if q != path):
                continue  # inside another bound path
            os.makedirs(path, 0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{holds[path]}", path, None, MS_BIND | MS_REC, None)
            _mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, None)
    finally:
        for fd in holds.values():
            os.close(fd)
    for path in covers:
        if os.path.isdir(path) and not os.path.islink(path):
            _mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                   "size=4k,nr_inodes=8,mode=0555")
    os.makedirs(workdir, 0o700, exist_ok=True)
    if owner is not None:
        os.chown(workdir, owner, owner)
    os.chdir(workdir)
    if new_proc:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    return read_only


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


def own_proc(pid: int, hide_net: bool) -> list:
    """Landlock read rules for a process's own ``/proc/<pid>``; with ``hide_net`` all of it but its ``net``
    directories (``/proc/self/net/unix`` lists the machine's unix sockets where no network namespace hides them)."""
    root = f"/proc/{pid}"
    if not hide_net:
        return [root]
    return _beneath(root, [f"{root}/net", f"{root}/task/{pid}/net"])


def apply_landlock(workdir: str, read_roots: list | None, hide_net: bool = False) -> None:
    """Restrict this process (and its children) with Landlock; raises OSError when the kernel refuses.
    ``read_roots``: paths readable beneath (a path, or ``(path, rights)`` for fewer rights, e.g. :data:`LIST_ONLY`);
    None: reads stay unrestricted (only writes, TCP and signals are handled). ``hide_net``: its own ``/proc/<pid>``
    without the network directories (:func:`own_proc`)."""
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
            path, rights = (p, read) if isinstance(p, str) else p
            allow(path, rights & read)
        if read_roots is not None:  # its own /proc entry only: no other process's environ, cmdline or memory
            for p in own_proc(os.getpid(), hide_net):
                path, rights = (p, read) if isinstance(p, str) else p
                allow(path, rights & read)
        if c.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(NO_NEW_PRIVS)")
        if c.syscall(_LL_RESTRICT, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(fd)


def read_roots() -> list[str]:
    """What a trusted sandboxed Python (the tests, a reference solution) may read under ``landlock_read``: its
    installation, its ``sys.path`` and the system directories."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable)), os.path.dirname(sys.executable)}
    roots |= {p for p in sys.path if p and os.path.isdir(p) and not p.startswith(os.getcwd())}
    roots |= set(SYSTEM_PATHS)
    return sorted(p for p in roots if p and os.path.exists(p))


# ------------------------------------------------------------------------------------------ what answers may read
SYSTEM_PATHS = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/sys") + DEVICES  # not the rest of /dev
LIST_ONLY = FS_READ_DIR  # a directory above a hidden one: its names can be listed, its files not read
_PACKAGE_DIRS = ("site-packages", "dist-packages")


def answer_python() -> str:
    """The interpreter answers run under: the base installation's binary, not a venv's (whose ``pyvenv.cfg`` and
    site-packages are the grader's)."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def stdlib_paths(python: str) -> list[str]:
    """The ``sys.path`` of ``python -I -S``: its standard library directories (the zip, ``lib-dynload``)."""
    import json  # lazy: only the grader's parent process asks (once per sandbox), never the child
    import subprocess  # lazy: as above

    try:
        out = subprocess.run([python, "-I", "-S", "-c", "import json, sys; print(json.dumps(sys.path))"],
                             capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
        paths = json.loads(out.stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        import sysconfig  # lazy: the fallback when the interpreter cannot be asked

        base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix, "installed_base": sys.base_prefix,
                "installed_platbase": sys.base_exec_prefix}
        got = sysconfig.get_paths(vars=base)
        paths = [got["stdlib"], got["platstdlib"], os.path.join(got["platstdlib"], "lib-dynload")]
    return sorted({os.path.realpath(p) for p in paths if p and os.path.exists(p)})


def _libpython() -> list[str]:
    """The shared ``libpython`` the base interpreter links, when it is one (pyenv's ``--enable-shared``)."""
    import sysconfig  # lazy: read once per sandbox in the grader, not in the confined child

    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        return []
    name, libdir = sysconfig.get_config_var("INSTSONAME") or "", sysconfig.get_config_var("LIBDIR") or ""
    path = os.path.join(libdir, name)
    return [os.path.realpath(path)] if name and os.path.exists(path) else []


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def hidden_paths(stdlib: list[str]) -> list[str]:
    """What an answer must not read though it may lie beneath a readable root: every site-packages directory (the
    grader's, its base installation's, the system's), the grader's other ``sys.path`` entries (an editable
    install's checkout, ``PYTHONPATH``), its venv, the checkout this package was imported from and the directory
    that holds it (the project's data beside it), and the grader's working directory."""
    import glob  # lazy: the grader computes the hidden paths once per sandbox; the confined child never does
    import site  # lazy: as above

    out = set(site.getsitepackages() + site.getsitepackages([sys.base_prefix, sys.base_exec_prefix]))
    out.add(site.getusersitepackages())
    for pattern in ("/usr/lib/python3*/*-packages", "/usr/local/lib/python3*/*-packages"):
        out |= {p for p in glob.glob(pattern) if os.path.basename(p) in _PACKAGE_DIRS}
    for d in stdlib:
        out |= {os.path.join(d, n) for n in _PACKAGE_DIRS}
    out |= {p for p in sys.path if p and not any(_under(os.path.realpath(p), s) for s in stdlib)}
    if sys.prefix != sys.base_prefix:
        out.add(sys.prefix)
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # (or its site-packages)
    out |= {checkout, os.path.dirname(checkout)}  # and beside it, the project's data (../shared)
    out.add(os.getcwd())
    real = {os.path.realpath(p) for p in out if p and os.path.isdir(p)}
    return sorted(p for p in real if not any(_under(d, p) for d in SYSTEM_PATHS))  # never / or a system directory


def _beneath(root: str, hidden: list[str]) -> list:
    """Landlock rules that grant ``root`` but none of ``hidden`` (Landlock grants whole trees): ``root`` itself when
    nothing hidden lies beneath it, else its names only (:data:`LIST_ONLY`) and each entry the same way."""
    if any(_under(root, h) for h in hidden):
        return []
    inner = [h for h in hidden if _under(h, root)]
    if not inner:
        return [root]
    try:
        names = sorted(os.listdir(root))
    except OSError:
        return []
    out: list = [(root, LIST_ONLY)]
    for n in names:
        path = os.path.join(root, n)
        if not os.path.islink(path):  # a rule opens its path, following a link: /proc/<pid>/root would grant /
            out += _beneath(path, inner)
    return out


def answer_view(python: str) -> tuple[list, list[str], list[str]]:
    """What an answer's process sees: ``(landlock read rules, directories to bind back into the mount namespace,
    directories to cover there with an empty tmpfs)``. Readable: ``python`` (:func:`answer_python`), its shared
    ``libpython``, its standard library and the system directories, less :func:`hidden_paths`."""
    stdlib = stdlib_paths(python)
    hidden = hidden_paths(stdlib)
    files = [python] + _libpython()
    needed = stdlib + files
    hidden = [h for h in hidden if not any(_under(n, h) for n in needed)]  # never the interpreter itself
    rules = list(files)
    for root in stdlib + [d for d in SYSTEM_PATHS if os.path.exists(d)]:
        rules += _beneath(root, hidden)
    keep = sorted({os.path.dirname(f) for f in files} | set(stdlib))
    scratch = os.path.realpath(tempfile.gettempdir())  # where the working directory is made
    covers = [h for h in hidden if h not in EMPTIED and not any(_under(k, h) for k in keep + [scratch])]
    covers = [h for h in covers if not any(_under(h, c) and h != c for c in covers)]  # outermost only
    return rules, keep, covers


def apply_rlimits(lim, nproc_limit: int | None) -> None:
    """``setrlimit`` soft = hard for the limits of ``lim`` (a :class:`graft_cli.reward.sandbox.Limits`): address
    space, CPU seconds, open files, file size, no core files, and processes when ``nproc_limit`` is set."""

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


_IOPRIO_GET = {"x86_64": 252, "aarch64": 31, "riscv64": 31, "i386": 290, "i686": 290}  # the system call's number


def io_priority() -> int:
    """This process's I/O priority (``ioprio_get(IOPRIO_WHO_PROCESS, 0)``; -1 where unknown)."""
    import platform  # lazy: asked once per answer in the grader, never in the confined child

    nr = _IOPRIO_GET.get(platform.machine())
    if nr is None:
        return -1
    return int(libc().syscall(ctypes.c_long(nr), ctypes.c_int(1), ctypes.c_int(0)))


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
    """The cgroup of one sandbox slot, which the processes of one run at a time join (the supervisor stays outside,
    so what a run charges - memfd and tmpfs pages included - and the OOM killer it may wake are that run's alone):
    ``pids.max = nproc`` and, where the controllers are there, ``cpus`` CPUs of
    bandwidth and ``memory_mb`` MiB of memory (tmpfs pages included). cgroup v2 under the caller's own cgroup, else
    one directory per v1 hierarchy (``pids``, ``cpu``, ``memory``). ``path`` is None when no pids cgroup could be
    made; :attr:`limits` names the limits that hold."""

    def __init__(self, name: str, nproc: int, cpus: float = 0.0, memory_mb: int = 0):
        self.path, self.dirs, self.limits = None, [], set()
        self.memory_file: str | None = None  # where the memory limit is written (:meth:`set_memory`)
        want = {"pids": [("pids.max", str(int(nproc)))]}
        if cpus > 0:
            want["cpu"] = [("cpu.max", f"{int(cpus * 100000)} 100000")]
        if memory_mb > 0:
            want["memory"] = [("memory.max", str(int(memory_mb) << 20)), ("memory.swap.max", "0")]
        v1 = {"cpu": [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", str(int(cpus * 100000)))],
              "memory": [("memory.limit_in_bytes", str(int(memory_mb) << 20))]}
        for base, ctrls in self._bases():
            for ctrl in [c for c in want if c in ctrls and c not in self.limits]:
                path = os.path.join(base, name)
                try:
                    os.makedirs(path, exist_ok=True)
                    for fname, value in v1.get(ctrl, want[ctrl]) if self._v1(base) else want[ctrl]:
                        if fname == "memory.swap.max" and not os.path.exists(os.path.join(path, fname)):
                            continue
                        with open(os.path.join(path, fname), "w") as f:
                            f.write(value)
                    self.limits.add(ctrl)
                    if ctrl == "memory":
                        self.memory_file = os.path.join(path, "memory.limit_in_bytes" if self._v1(base) else
                                                        "memory.max")
                    if path not in self.dirs:
                        self.dirs.append(path)
                    if ctrl == "pids":
                        self.path = path
                except OSError:
                    if path not in self.dirs:
                        try:
                            os.rmdir(path)
                        except OSError:
                            pass

    @staticmethod
    def _v1(base: str) -> bool:
        return not os.path.exists(os.path.join(base, "cgroup.controllers")) and "/sys/fs/cgroup/" in base + "/"

    @staticmethod
    def _bases() -> list[tuple[str, set]]:
        """(directory, controllers usable there) to create a slot's cgroup under."""
        out = []
        try:
            with open("/proc/self/cgroup") as f:
                lines = f.read().splitlines()
        except OSError:
            return out
        for line in lines:
            hid, ctrls, path = (line.split(":", 2) + ["", ""])[:3]
            if hid == "0" and not ctrls and os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
                base = "/sys/fs/cgroup" + path.rstrip("/")
                try:
                    with open(os.path.join(base, "cgroup.subtree_control")) as f:
                        have = set(f.read().split())
                except OSError:
                    have = set()
                out.append((base, have | {"pids"}))
            else:
                for c in ("pids", "cpu", "memory"):
                    if c in ctrls.split(","):
                        mnt = "/sys/fs/cgroup/" + ("cpu,cpuacct" if c == "cpu" and os.path.isdir(
                            "/sys/fs/cgroup/cpu,cpuacct") else c)
                        out.append((mnt + path.rstrip("/"), {c}))
        return out

    def set_memory(self, memory_mb: int) -> None:
        """Change the memory limit (between runs: a run that needs more than the slot's usual, e.g. a reference
        solution computing expected outputs). Raises OSError."""
        if self.memory_file:
            with open(self.memory_file, "w") as f:
                f.write(str(int(memory_mb) << 20))

    def join(self) -> None:
        for d in self.dirs:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    def pids(self) -> list[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    def kill_all(self, limit_s: float = 5.0) -> int:
        """SIGKILL every task in the cgroup (the supervisor never lives inside)."""
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
        for d in self.dirs:
            try:
                os.rmdir(d)
            except OSError:
                pass

    @classmethod
    def remove_stale(cls, prefix: str) -> int:
        """Remove the empty cgroups named ``prefix*`` under this process's own cgroups (those of a supervisor that
        was killed before it could remove its own); how many were removed."""
        n = 0
        for base, _ in cls._bases():
            try:
                names = [d for d in os.listdir(base) if d.startswith(prefix)]
            except OSError:
                continue
            for d in names:
                path, deadline = os.path.join(base, d), time.monotonic() + 2.0
                while True:
                    try:
                        with open(os.path.join(path, "cgroup.procs")) as f:
                            kill_each(int(x) for x in f.read().split())
                        os.rmdir(path)
                        n += 1
                        break
                    except OSError:
                        if time.monotonic() > deadline or not os.path.isdir(path):
                            break
                        time.sleep(0.01)
        return n
