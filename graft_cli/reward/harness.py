"""The program that runs a code answer and its tests in the sandbox (:data:`HARNESS`), and what it reads on stdin
(:func:`payload`).

**No verdict depends on the answer's process.** Answers run under the base interpreter with ``-I -S`` in the
sandbox's ``answer`` view (:mod:`graft_cli.reward.sandbox`): ``sys.path`` is the standard library, and neither the
grader's site-packages nor the checkout nor the project's data can be read there. For ``io`` and ``call`` the
expected outputs never enter the sandbox: the harness (:data:`HARNESS`) writes one result line - what the program
printed, or what each call returned as plain data with exact types (tagged JSON, graft_cli/reward/convert.py: a
subclass or any other object is refused) - and the comparison happens in the grader
(:mod:`graft_cli.reward.verdicts`), on values rebuilt as real built-ins. A run that writes anything but one
well-formed line (two lines, bad JSON, a value that does not decode, nesting too deep) is ``code_error``. Whatever
the program does to the harness in its own process (frames, closures, ``gc``, signal handlers, threads, import
hooks) it can only change that line, i.e. what it answered.

The ``call`` kind also runs EvalPlus's way (graft_cli/reward/evalplus.py): ``quiet`` (the program's prints kept in
memory, reading stdin raises: EvalPlus's ``swallow_io``), ``entry_only`` (the entry point by its name, no ``Solution``
class), ``limits`` (each call's wall clock, a ``SIGALRM`` timer raising ``TimeoutException``), ``wall_s`` (the
run's wall clock from its first call, which cuts each call's limit), ``times`` (each call's wall time in its
record: a reference's) and ``reduce`` 2 (any value to whether it is not None: a reference's). The timers run in the
answer's process and bind only an answer that leaves them alone; the sandbox's wall clock binds every one.
"""

from __future__ import annotations

import json

HARNESS = r"""# graft-code-harness
def _main():
    import builtins, collections, json, math, os, sys
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # Python < 3.11's ints: a test's large numbers are the tests' business
    from _json import encode_basestring_ascii as _esc
    _w, _fd, _type, _loads, _isfin = os.write, int(sys.argv[1]), type, json.loads, math.isfinite
    _ri, _rf, _hex, _join, _items = int.__repr__, float.__repr__, bytes.hex, ",".join, dict.items
    _bits, _ifmt, _BIG = int.bit_length, int.__format__, 14000  # 2**14000 < 10**4300: int <-> str's digit limit
    _Ctr, _OD, _DD, _DQ = collections.Counter, collections.OrderedDict, collections.defaultdict, collections.deque
    _oditems, _facts = _OD.items, (int, float, str, list, dict, set, frozenset, tuple, bool, bytes, complex)
    _compile, _exec, _callable, _len, _exc, _str = compile, exec, callable, len, BaseException, str

    def _quit(code=None):  # what site gives every interpreter, which -S leaves out: exit() / quit() in answers
        raise SystemExit(code)

    if not hasattr(builtins, "exit"):
        builtins.exit = builtins.quit = _quit

    class _NP(Exception):
        pass

    class _Lost(BaseException):  # the answer's process ended before it answered: no test may catch it
        pass

    class _Bad(BaseException):  # the answer's process answered out of protocol
        pass

    def enc(x, d=0):  # tagged plain data (graft_cli/reward/convert.py), exact types only
        t = _type(x)
        if d > 64:
            raise _NP
        if x is None:
            return "null"
        if t is bool:
            return "true" if x else "false"
        if t is int:  # beyond the decimal conversion limit: hex, linear both ways
            return _ri(x) if _bits(x) <= _BIG else '{"i":"' + _ifmt(x, "x") + '"}'
        if t is float:
            return _rf(x) if _isfin(x) else '{"f":"' + _rf(x) + '"}'
        if t is str:
            return _esc(x)
        if t is list:
            return "[" + _join([enc(v, d + 1) for v in x]) + "]"
        if t is tuple:
            return '{"t":[' + _join([enc(v, d + 1) for v in x]) + "]}"
        if t is set or t is frozenset:
            return '{"' + ("s" if t is set else "fs") + '":[' + _join([enc(v, d + 1) for v in x]) + "]}"
        if t is dict or t is _Ctr:  # the dict's own storage (dict.items), not a Counter's (patchable) methods
            return '{"' + ("d" if t is dict else "ct") + '":' + pairs(_items(x), d) + "}"
        if t is _OD:  # in its own order (move_to_end changes that, not the dict storage's)
            return '{"od":' + pairs(_oditems(x), d) + "}"
        if t is _DD:  # with its default factory where that is a built-in type, else none
            f = x.default_factory
            name = next((c.__name__ for c in _facts if c is f), None)
            return '{"dd":[' + ('"' + name + '"' if name else "null") + "," + pairs(_items(x), d) + "]}"
        if t is _DQ:
            m = x.maxlen
            return '{"q":[' + ("null" if m is None else _ri(m)) + ",[" + _join([enc(v, d + 1) for v in x]) + "]]}"
        if t is bytes:
            return '{"b":"' + _hex(x) + '"}'
        if t is complex:
            return '{"c":[' + enc(x.real, d + 1) + "," + enc(x.imag, d + 1) + "]}"
        raise _NP

    def pairs(items, d):
        return "[" + _join(["[" + enc(k, d + 1) + "," + enc(v, d + 1) + "]" for k, v in items]) + "]"

    def kv(v, d):  # decoded (key, value) pairs of a tagged mapping
        if _type(v) is not list or not all(_type(e) is list and _len(e) == 2 for e in v):
            raise _NP
        return [(dec(a, d + 1), dec(b, d + 1)) for a, b in v]

    def dec(x, d=0):  # the built-in value of tagged data; strict: it may come from an answer's process
        t = _type(x)
        if d > 64:
            raise _NP
        if x is None or t is bool or t is int or t is float or t is str:
            return x
        if t is list:
            return [dec(v, d + 1) for v in x]
        if t is dict and _len(x) == 1:
            (k, v), = _items(x)
            if k == "t" and _type(v) is list:
                return tuple(dec(e, d + 1) for e in v)
            if k in ("s", "fs") and _type(v) is list:
                return (set if k == "s" else frozenset)(dec(e, d + 1) for e in v)
            if k in ("d", "od", "ct"):
                items = kv(v, d)
                return _OD(items) if k == "od" else dict(items) if k == "d" else _Ctr(dict(items))
            if k == "dd" and _type(v) is list and _len(v) == 2:
                f = next((c for c in _facts if c.__name__ == v[0]), None)
                if f is None and v[0] is not None:
                    raise _NP
                return _DD(f, kv(v[1], d))
            if k == "q" and _type(v) is list and _len(v) == 2 and _type(v[1]) is list \
                    and (v[0] is None or (_type(v[0]) is int and v[0] >= 0)):
                return _DQ([dec(e, d + 1) for e in v[1]], v[0])
            if k == "f" and v in ("nan", "inf", "-inf"):
                return float(v)
            if k == "i" and _type(v) is str:
                return int(v, 16)
            if k == "b" and _type(v) is str:
                return bytes.fromhex(v)
            if k == "c" and _type(v) is list and _len(v) == 2 and all(_type(e) in (int, float) for e in v):
                return complex(*v)
        raise _NP

    def emit(text, fd=_fd):
        data = (text + "\n").encode()
        while data:
            data = data[_w(fd, data):]

    def ename(e):
        try:
            return _esc(_str(_type(e).__name__)[:100])
        except _exc:
            return '"?"'

    def run_tests(ns, cand, tests):  # True when the tests passed; else the failure's line is written
        try:
            before = ns.get("check")  # MBPP's entry point may itself be called check (Mbpp/56)
            _exec(tests, ns)
            chk = ns.get("check")
            if _callable(chk) and chk is not before and cand is not None:  # the tests defined it
                chk(cand)
            return True
        except AssertionError:
            emit('{"status":"fail"}')
        except _NP:
            emit('{"status":"error","error":"NotPlainData","phase":"tests"}')
        except _Lost:
            emit('{"status":"error","error":"AnswerLost","phase":"tests"}')
        except _Bad:
            emit('{"status":"error","error":"BadReply","phase":"tests"}')
        except _exc as e:
            emit('{"status":"error","error":' + ename(e) + ',"phase":"tests"}')
        return False

    def serve():  # the answer's side of the assert kind: calls in, plain values out, nothing else
        scan = json.decoder.JSONDecoder().scan_once  # C scanner: the program's builtins cannot change how it reads
        rq = os.fdopen(os.dup(0), "rb")
        nul = os.open(os.devnull, os.O_RDONLY)
        os.dup2(nul, 0)
        os.close(nul)
        try:
            p = _loads(rq.readline())
            code = _compile(p["program"], "solution.py", "exec", 0, True, 0)
        except _exc as e:
            return emit('{"error":' + ename(e) + ',"phase":"compile"}')
        g = {"__name__": "solution", "__builtins__": builtins}
        try:
            _exec(code, g)
        except _exc as e:
            return emit('{"error":' + ename(e) + ',"phase":"program"}')
        fn = g.get(p["entry_point"])
        if not _callable(fn):
            return emit('{"error":"NoEntryPoint","phase":"entry"}')
        emit('{"ready":true}')
        while True:
            line = rq.readline()
            if not line:
                return
            try:
                q = scan(line.decode(), 0)[0]
                out = fn(*dec(q["a"]), **dec(q["k"]))
            except _exc as e:
                emit('{"error":' + ename(e) + "}")
                continue
            try:
                emit('{"out":' + enc(out) + "}")
            except _exc:
                emit('{"error":"NotPlainData"}')

    if sys.argv[2:] == ["serve"]:
        return serve()
    p = _loads(sys.stdin.buffer.read())
    nonce, kind = p.pop("nonce"), p["kind"]
    try:
        code = _compile(p.pop("program"), "solution.py", "exec", 0, True, 0) if kind != "assert" else None
        tests = _compile(p.pop("tests"), "tests.py", "exec", 0, True, 0) if "tests" in p else None
    except _exc as e:
        emit('{"status":"error","error":' + ename(e) + ',"phase":"compile"}')
        return
    if kind == "io":
        saved_in, saved_out, outs, cap = os.dup(0), os.dup(1), [], p["out_cap"]
        _open, _dup2, _close, _read = os.open, os.dup2, os.close, os.read
        import io
        for text in p["inputs"]:
            with open("stdin.txt", "wb") as f:
                f.write(text.encode())
            fi, fo = _open("stdin.txt", os.O_RDONLY), _open("stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            _dup2(fi, 0), _dup2(fo, 1)
            _close(fi), _close(fo)
            sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="replace")
            sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="replace",
                                          write_through=True)
            err = "null"
            try:
                _exec(code, {"__name__": "__main__", "__builtins__": builtins})
            except SystemExit:
                pass
            except _exc as e:
                err = ename(e)
            try:
                sys.stdout.flush()
            except _exc:
                pass
            _dup2(saved_in, 0), _dup2(saved_out, 1)
            sys.stdin, sys.stdout = sys.__stdin__, sys.__stdout__
            fo = _open("stdout.txt", os.O_RDONLY)
            out = _read(fo, cap + 1)
            _close(fo)
            outs.append('{"out":' + _esc(out.decode("utf-8", "replace")) + ',"error":' + err + ',"over":'
                        + ("true" if _len(out) > cap else "false") + "}")
            if err != "null":
                break
        emit('{"io":[' + _join(outs) + "]}")
        return
    entry = p.get("entry_point") or ""
    if kind == "assert":  # the tests' side (trusted): each call of the entry point is a request to the answer
        try:  # not dumpable: the answer's process (same uid) cannot open this one's /proc files
            import ctypes
            ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
        except _exc:
            pass
        rq, rin, lost = int(sys.argv[2]), os.fdopen(int(sys.argv[3]), "rb"), [False]

        def recv():
            line = rin.readline(p["out_cap"] + 1)
            while line.startswith(b"#features "):  # what the answer's sandbox got, written before it started
                line = rin.readline(p["out_cap"] + 1)
            if not line:  # the answer's process ended
                lost[0] = True
                raise _Lost
            try:
                if not line.endswith(b"\n"):  # over the cap
                    raise _NP
                msg = _loads(line)
                if _type(msg) is not dict:
                    raise _NP
                return msg
            except _exc:
                lost[0] = True
                raise _Bad from None

        def candidate(*args, **kw):
            if lost[0]:
                raise _Bad
            emit('{"a":' + enc(list(args)) + ',"k":' + enc(kw) + "}", rq)
            msg = recv()
            if "out" in msg:
                return dec(msg["out"])
            cls = getattr(builtins, _str(msg.get("error")), None)
            if _type(cls) is type and issubclass(cls, Exception):
                try:
                    err = cls()
                except _exc:
                    err = RuntimeError(msg.get("error"))
            else:
                err = RuntimeError("the answer raised " + _str(msg.get("error"))[:100])
            raise err

        emit(json.dumps({"program": p["program"], "entry_point": entry}), rq)
        try:
            ready = recv()
        except _Lost:
            ready = {"error": "AnswerLost", "phase": "program"}
        except _Bad:
            ready = {"error": "BadReply", "phase": "program"}
        if ready.get("ready") is not True:
            phase = ready.get("phase") if ready.get("phase") in ("compile", "program", "entry") else "program"
            emit('{"status":"error","error":' + _esc(_str(ready.get("error"))[:100]) + ',"phase":"' + phase + '"}')
            return
        t = {"__name__": "__main__", "__builtins__": builtins}
        try:  # the prompt's own helpers (HumanEval/32's poly); a bare function header does not compile
            _exec(_compile(p.get("prompt") or "", "prompt.py", "exec", 0, True, 0), t)
        except _exc:
            pass
        t[entry] = candidate
        if run_tests(t, candidate, tests) and not lost[0]:
            emit('{"status":"pass","nonce":' + _esc(nonce) + "}")
        return
    g = {"__name__": "solution", "__builtins__": builtins}
    import io, signal, time

    class TimeoutException(Exception):  # EvalPlus's: an Exception, which an answer may catch there too
        pass

    class _WriteOnly(io.StringIO):  # EvalPlus's swallow_io: output kept in memory, reading raises
        def read(self, *a, **k):
            raise OSError

        readline = readlines = read

        def readable(self, *a, **k):
            return False

    def _on_alarm(signum, frame):
        raise TimeoutException("Timed out!")

    def _swallow():
        sys.stdout = sys.stderr = sys.stdin = _WriteOnly()

    def _unswallow():
        sys.stdout, sys.stderr, sys.stdin = sys.__stdout__, sys.__stderr__, sys.__stdin__

    try:
        if p.get("quiet"):
            _swallow()
        try:
            _exec(code, g)
        finally:
            if p.get("quiet"):
                _unswallow()
    except _exc as e:
        emit('{"status":"error","error":' + ename(e) + ',"phase":"program"}')
        return
    if kind == "call":
        tagged = p.get("tagged", False)
        fn = g.get(p["fn_name"])
        try:
            if not _callable(fn) and not p.get("entry_only"):
                fn = getattr(g["Solution"](), p["fn_name"])
            elif not _callable(fn):  # EvalPlus: the entry point by its name, nothing else
                raise NameError(p["fn_name"])
        except _exc as e:
            emit('{"status":"error","error":' + ename(e) + ',"phase":"entry"}')
            return
        res, red, i = [], p.get("reduce") or (), 0
        lims, timed, quiet = p.get("limits"), p.get("times", False), p.get("quiet", False)
        _now, _mono, wall = time.time, time.monotonic, p.get("wall_s")
        dead = None if wall is None else _mono() + wall  # the run's wall clock (seconds), from its first call
        if lims:
            signal.signal(signal.SIGALRM, _on_alarm)
        for args in p["inputs"]:
            try:
                a = dec(args) if tagged else args
                if quiet:
                    _swallow()
                if lims:
                    left = lims[i] if dead is None else min(lims[i], dead - _mono())
                    if left <= 0:
                        raise TimeoutException("Timed out!")
                    signal.setitimer(signal.ITIMER_REAL, left)
                t0 = _now()
                try:
                    out = fn(*a)
                finally:
                    t1 = _now()
                    if lims:
                        signal.setitimer(signal.ITIMER_REAL, 0)
                    if quiet:
                        _unswallow()
            except _exc as e:
                res.append('{"error":' + ename(e) + "}")
                break
            if red and red[i] and (red[i] == 2 or _type(out) is not bool):  # notnone: whether it returned something
                out = out is not None  # (2: any value, bools too: EvalPlus's expected outputs of those tasks)
            try:
                res.append('{"out":' + enc(out) + (',"t":' + _rf(t1 - t0) if timed else "") + "}")
            except _exc:
                res.append('{"error":"NotPlainData"}')
                break
            i += 1
        emit('{"calls":[' + _join(res) + "]}")
        return
    # record: the reference solution under the rewritten tests (trusted code, sandboxed in the trusted view)
    events, red = [], frozenset(p.get("reduce_sites") or ())

    def rec(site, f, *args, **kw):
        events.append("[" + _join([_ri(site), enc(list(args)), enc(kw)]))
        r = f(*args, **kw)
        events[-1] += "," + enc(r if site not in red or _type(r) is bool else r is not None) + "]"
        return r

    def expect(site, key, v):
        events.append("[" + _ri(site) + "," + _esc(key) + "," + enc(v) + "]")
        return v

    g["__graft_rec__"], g["__graft_exp__"] = rec, expect
    if run_tests(g, g.get(entry) if entry else None, tests):
        emit('{"status":"pass","events":[' + _join(events) + "]}")


_main()
__import__("os")._exit(0)  # no thread, atexit hook or finaliser of the program runs after the harness's line
"""


def payload(spec: dict, program: str, nonce: str, out_cap: int, record: tuple[str, list] | None = None) -> bytes:
    """What the harness reads on stdin; ``record``: the rewritten tests and their call sites' rules (record
    mode)."""
    p = {"kind": spec["kind"], "program": program, "nonce": nonce, "out_cap": out_cap}
    if spec["kind"] == "assert":
        tests = record[0] if record is not None else spec["tests"]
        p.update(kind="record" if record is not None else "assert", tests=tests, entry_point=spec["entry_point"],
                 prompt=spec.get("prompt") or "")
        if record is not None:
            p["reduce_sites"] = [i for i, r in enumerate(record[1]) if r["rule"] == "notnone"]
    elif spec["kind"] == "call":
        p.update(inputs=spec["inputs"], fn_name=spec["fn_name"], tagged="rules" in spec)
        if any(r["rule"] == "notnone" for r in spec.get("rules") or ()):
            p["reduce"] = [int(r["rule"] == "notnone") for r in spec["rules"]]
    else:
        p.update(inputs=spec["inputs"])
    return json.dumps(p).encode()
