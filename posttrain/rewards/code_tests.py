"""Assert tests for the ``code`` reward, run so that the candidate's code cannot forge its own verdict.

Key insight: inside one process the candidate's code has every power the harness has (it can read the
harness's frames and memory, find and write any file descriptor, rewrite the test's frame with a trace
hook), so no secret or channel inside the sandbox is truly out of its reach. What it cannot reach is the
trainer. So for the common test form ``assert EXPR == LITERAL`` the *expected value never enters the
sandbox*: the child only evaluates ``EXPR`` and reports its value; the trainer compares.

    test  "assert add(2, 3) == 5"  ->  child gets hole "add(2, 3)", trainer keeps ("cmp", [hole 0, 5], ["Eq"])
    child : exec(solution, ns) ; v = eval("add(2, 3)", ns) ; report "NONCE step 0 v <repr(v)>"
    parent: literal_eval(repr) == 5 ?

A *sealed* assert is a top-level ``assert`` whose condition is a comparison (``== != < <= > >= in not in``,
chains like ``0 <= f(x) < 10``, and ``is``/``is not`` against None/True/False) in which every operator has a
literal on at least one side, or an ``and`` / ``not`` of such comparisons. Its verdict cannot be forged:
a candidate that takes over the report channel can only choose the values of the holes, which an honest
program could do by returning them. Values travel as literals of exact built-in types (numpy values via
``tolist()``); anything else — an object whose ``__eq__`` always returns True, a str subclass, NaN — fails.
(Python would call that ``__eq__`` and pass; we are stricter on purpose.)

This holds under bwrap, where the trainer is out of the child's sight; in the rlimit opt-in the code can
read the trainer's memory through ``/proc`` (as the same user), so nothing is sealed there.

Every other statement of a test (setup lines, bare ``assert f(x)``, comparisons of two computed values,
``assert`` inside a ``def check(...)``) runs in the child and is reported "ok" by the in-sandbox harness
when it returns. That harness defeats what a policy finds by accident: shadowing ``exec``/``assert``
helpers in its namespace (the solution and tests run in their own dict namespace), patching ``builtins``,
``sys`` or ``os`` (the harness keeps its references as locals captured before the solution runs), exiting
early (``sys.exit``, ``os._exit``, ``SystemExit``: a pass is a record written *after* the step returns),
printing fake pass lines (reports go to a dup of the original stdout; the solution's stdout is redirected
to stderr) and records in the wrong order or with a wrong nonce (the whole completion scores 0). It does
NOT defeat code that introspects the harness on purpose (``sys._getframe``/``gc`` to read the nonce, then
``os.write`` to the report fd found in ``/proc/self/fd``, or a trace hook that jumps over the assert):
such tests are only as strong as that. Top-level ``assert f(args) == literal`` tests are the strong form.

Tests run in order in one child per completion, sharing a namespace (as a script would); a test that
raises is failed and the next one runs; a hang fails the tests not yet reported.
"""

from __future__ import annotations

import ast
import json
import secrets

from posttrain.errors import UserError

_HARNESS = r"""
def _posttrain_harness():
    import builtins, json, os, sys
    # Everything used after the solution runs is captured here as a local: patching builtins/os/sys is moot.
    exec_, eval_, compile_, type_, repr_, len_, bool_, str_, range_ = exec, eval, compile, type, repr, len, bool, str, range
    getattr_, hasattr_, BaseException_ = getattr, hasattr, BaseException
    int_, float_, complex_, str_t, bytes_, none_t = int, float, complex, str, bytes, type(None)
    list_, tuple_, dict_, set_, frozenset_ = list, tuple, dict, set, frozenset
    write, exit_, inf = os.write, os._exit, float("inf")
    nonce, _, plan = sys.stdin.buffer.read().decode("utf-8").partition("\n")
    plan = json.loads(plan)
    code, steps = plan["code"], plan["steps"]
    chan = os.dup(1)  # the report channel; the solution's own stdout goes to stderr
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    try:
        import traceback
        print_exc = traceback.print_exc
    except BaseException_:
        print_exc = lambda: None

    def ser(v, depth):
        t = type_(v)
        if t is int_ or t is bool_ or t is none_t or t is str_t or t is bytes_ or t is complex_:
            return repr_(v)
        if t is float_:
            if v != v:
                raise ValueError("nan")
            return "1e999" if v == inf else ("-1e999" if v == -inf else repr_(v))
        if depth > 64:
            raise ValueError("too deep")
        if t is list_:
            return "[" + ", ".join([ser(x, depth + 1) for x in v]) + "]"
        if t is tuple_:
            items = [ser(x, depth + 1) for x in v]
            return "(" + ", ".join(items) + ("," if len_(items) == 1 else "") + ")"
        if t is dict_:
            return "{" + ", ".join([ser(k, depth + 1) + ": " + ser(x, depth + 1) for k, x in v.items()]) + "}"
        if t is set_ or t is frozenset_:
            return "{" + ", ".join([ser(x, depth + 1) for x in v]) + "}" if len_(v) else "set()"
        if getattr_(t, "__module__", "") == "numpy" and hasattr_(v, "tolist"):
            return ser(v.tolist(), depth + 1)
        raise TypeError("not a literal")

    def report(text):
        write(chan, (nonce + " " + text + "\n").encode("utf-8"))

    ns = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec_(compile_(code, "solution.py", "exec"), ns)
    except BaseException_:
        try:
            print_exc()
        finally:
            exit_(0)  # no record: every test fails
    failed = -1
    for i in range_(len_(steps)):
        test, kind, payload = steps[i]
        if test == failed:
            continue
        try:
            if kind == "exec":
                exec_(compile_(payload, "test", "exec"), ns)
                report(str_(i) + " ok")
            else:
                for j in range_(len_(payload)):
                    v = eval_(compile_(payload[j], "test", "eval"), ns)
                    try:
                        rec = "v " + ser(v, 0)
                    except BaseException_:
                        rec = "x"
                    report(str_(i) + " " + str_(j) + " " + rec)
        except BaseException_:
            failed = test
            try:
                print_exc()
            except BaseException_:
                pass
    exit_(0)


_posttrain_harness()
"""

_OPS = {
    "Eq": lambda a, b: a == b,
    "NotEq": lambda a, b: a != b,
    "Lt": lambda a, b: a < b,
    "LtE": lambda a, b: a <= b,
    "Gt": lambda a, b: a > b,
    "GtE": lambda a, b: a >= b,
    "In": lambda a, b: a in b,
    "NotIn": lambda a, b: a not in b,
    "Is": lambda a, b: a is b,
    "IsNot": lambda a, b: a is not b,
}
_SINGLETONS = (None, True, False)


class _Unrepresentable:
    """A value the child could not send as a literal: every comparison with it fails."""


def _literal(node: ast.AST) -> tuple[bool, object]:
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _template(node: ast.AST, holes: list[str]):
    """The trainer-side check of a sealed condition (holes get the child-side expressions), or None."""
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.And):
        subs = [_template(v, holes) for v in node.values]
        return None if any(s is None for s in subs) else ("and", subs)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        sub = _template(node.operand, holes)
        return None if sub is None else ("not", sub)
    if not isinstance(node, ast.Compare):
        return None
    operands = [node.left, *node.comparators]
    lits = [_literal(o) for o in operands]
    for k, op in enumerate(node.ops):
        (a_lit, a), (b_lit, b) = lits[k], lits[k + 1]
        if not (a_lit or b_lit):
            return None  # two computed sides: the child would choose both
        if isinstance(op, (ast.Is, ast.IsNot)) and not any(
            lit and any(v is s for s in _SINGLETONS) for lit, v in ((a_lit, a), (b_lit, b))
        ):
            return None
    out = []
    for o, (is_lit, v) in zip(operands, lits):
        if is_lit:
            out.append(("lit", v))
        else:
            holes.append(ast.unparse(o))
            out.append(("hole", len(holes) - 1))
    return ("cmp", out, [type(op).__name__ for op in node.ops])


_IO_KEYS = ("input", "output")
_FORMS = 'a list of assert strings or a list of {"input": ..., "output": ...} dicts'


def _describe(value) -> str:
    """What a user's value is, short: "dict with keys ['input', 'output']", "str 'assert f(1) == 2'"."""
    if isinstance(value, dict):
        return f"dict with keys {sorted(map(str, value))[:8]}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def check_tests(value, row: int | None = None) -> list:
    """The ``tests`` value of one row as a list, or UserError naming the row and what it got.

    Accepted: a list (or tuple) of assert strings, or of ``{"input": ..., "output": ...}`` dicts whose values are
    text or numbers (read as their text); None or an empty list is no tests (the row scores 0). Everything else
    is refused, because it would otherwise be read as something else: one dict iterates as its keys, which
    would run ``input`` and ``output`` as two assert tests; one string iterates as its characters.

    Example: check_tests([{"input": "1 2\\n", "output": "3"}]) -> the same list;
    check_tests({"input": "1 2\\n", "output": "3"}, row=0) -> UserError "code tests of row 0 must be ...".
    """
    where = "code tests" if row is None else f"code tests of row {row}"
    if value is None:
        return []
    if not isinstance(value, (list, tuple)):
        hint = " (put it in a list)" if isinstance(value, (str, dict)) else ""
        raise UserError(f"{where} must be {_FORMS}; got {_describe(value)}{hint}")
    tests = list(value)
    if all(isinstance(t, str) for t in tests):
        return tests
    for k, t in enumerate(tests):
        if not isinstance(t, (str, dict)):
            raise UserError(f"{where} must be {_FORMS}; got {_describe(t)} at item {k}")
    if not all(isinstance(t, dict) for t in tests):
        raise UserError(f"{where} must be {_FORMS}, not a mix of both; got assert strings and dicts")
    for k, t in enumerate(tests):
        if sorted(t) != sorted(_IO_KEYS):
            raise UserError(f"{where} must be {_FORMS}; got {_describe(t)} at item {k}")
        for key in _IO_KEYS:
            v = t[key]
            if isinstance(v, bool) or not isinstance(v, (str, int, float)):
                raise UserError(f"{where}: the {key!r} of item {k} must be text; got {_describe(v)}")
    return tests


def plan_tests(tests: list[str]) -> list[tuple[int, str, object, object]]:
    """Split assert tests into steps ``(test index, "exec", source, None)`` or ``(test, "check", holes, template)``.

    Example: ["x = f(3)\\nassert x == 9"] -> [(0, "exec", "x = f(3)", None), (0, "check", ["x"], ("cmp", ...))].
    Raises UserError for a test that is not valid Python (every completion would silently score 0).
    """
    steps = []
    for t, src in enumerate(tests):
        try:
            module = ast.parse(src)
        except SyntaxError as e:
            raise UserError(f"code test {t} ({src[:60]!r}) is not valid Python: {e.msg} (line {e.lineno})") from None
        if not module.body:
            raise UserError(f"code test {t} ({src[:60]!r}) is empty")
        for stmt in module.body:
            holes: list[str] = []
            template = _template(stmt.test, holes) if isinstance(stmt, ast.Assert) else None
            if template is not None:
                steps.append((t, "check", holes, template))
            else:
                steps.append((t, "exec", ast.unparse(stmt), None))
    return steps


def _value(rec: str):
    if rec == "x":
        return _Unrepresentable()
    try:
        return ast.literal_eval(rec[2:])
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _Unrepresentable()


def _check(template, values: list) -> bool:
    kind = template[0]
    if kind == "and":
        return all(_check(s, values) for s in template[1])
    if kind == "not":
        return not _check(template[1], values)
    operands = [values[x] if k == "hole" else x for k, x in template[1]]
    if any(isinstance(v, _Unrepresentable) for v in operands):
        return False
    try:
        return all(bool(_OPS[op](operands[k], operands[k + 1])) for k, op in enumerate(template[2]))
    except Exception:  # noqa: BLE001 - e.g. 3 < "a": the assert would have raised
        return False


def score_reports(stdout: str, nonce: str, steps: list, n_tests: int) -> float:
    """Fraction of tests passed, from the child's report lines; 0.0 when the reports were tampered with."""
    expected = []  # (step, hole or None) in the order the harness reports them
    for i, (_, kind, payload, _) in enumerate(steps):
        expected += [(i, None)] if kind == "exec" else [(i, j) for j in range(len(payload))]
    first_of_test = {}
    for pos, (i, _) in enumerate(expected):
        first_of_test.setdefault(steps[i][0], pos)
    lines = stdout.split("\n")[:-1]  # a last line without "\n" was cut off (deadline, size cap): ignored
    got: dict[tuple[int, int | None], str] = {}
    pos = 0
    prefix = nonce + " "
    for line in lines:
        if not line.startswith(prefix):
            return 0.0
        fields = line[len(prefix) :].split(" ", 2)
        key = (int(fields[0]), None) if len(fields) == 2 and fields[1] == "ok" and fields[0].isdigit() else None
        if (
            key is None
            and len(fields) == 3
            and fields[0].isdigit()
            and fields[1].isdigit()
            and fields[2][:2] in ("v ", "x")
        ):
            key = (int(fields[0]), int(fields[1]))
        if key is None:
            return 0.0
        # the next record is the next expected one, or the first of a later test (the current test raised)
        candidates = [pos] + [p for p in first_of_test.values() if p > pos]
        match = next((p for p in candidates if p < len(expected) and expected[p] == key), None)
        if match is None:
            return 0.0
        got[key] = fields[-1] if key[1] is not None else "ok"
        pos = match + 1
    passed = [True] * n_tests
    for i, (t, kind, payload, template) in enumerate(steps):
        if kind == "exec":
            passed[t] = passed[t] and (i, None) in got
        else:
            keys = [(i, j) for j in range(len(payload))]
            passed[t] = passed[t] and all(k in got for k in keys) and _check(template, [_value(got[k]) for k in keys])
    return sum(passed) / n_tests


def run_assert_tests(code: str, tests: list[str], run) -> float:
    """Fraction of assert ``tests`` that ``code`` passes; ``run(program, stdin) -> SandboxResult`` runs the child."""
    steps = plan_tests(tests)
    nonce = secrets.token_hex(16)
    plan = {"code": code, "steps": [[t, kind, payload] for t, kind, payload, _ in steps]}
    res = run(_HARNESS, nonce + "\n" + json.dumps(plan))
    return score_reports(res.stdout, nonce, steps, len(tests))
