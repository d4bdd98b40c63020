"""The code reward's verdict cannot be forged by the candidate: every attack the harness claims to defeat.

Each attack is appended to a WRONG solution (``add`` returns 0; no test expects 0) and must score 0.0;
correct code scores 1.0 and partial passes the right fraction. The sandbox mode is whatever ``auto`` gives
(bwrap here; rlimit opt-in where bwrap is missing — the harness does not depend on the mode). The last test
pins the documented limit: a candidate that introspects the harness forges *unsealed* tests.
"""

import ast
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import UserError
from posttrain.rewards import code_tests, isolation, verifiers
from posttrain.rewards.code_tests import _check, plan_tests, score_reports
from posttrain.rewards.sandbox import run_python
from posttrain.rewards.verifiers import make_code_reward, run_tests

MODE = "bwrap" if isolation.bwrap_problem() is None else "rlimit"
WRONG = "def add(a, b):\n    return 0\n"
RIGHT = "def add(a, b):\n    return a + b\n"
SEALED = ["assert add(2, 3) == 5", "assert add(10, 5) == 15", "assert add(-4, 1) == -3"]
UNSEALED = ["def check(f):\n    assert f(2, 3) == 5\ncheck(add)", "assert add(1, 2) == add(2, 1) + 0 * add(9, 9) + 1"]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", isolation.WeakSandboxWarning)
        yield


def score(code, tests, **kw):
    return run_tests(code, tests, isolation=MODE, wall_timeout_s=kw.pop("wall_timeout_s", 5.0), **kw)


_FIND_REPORT = """
import sys
def _report():
    f = sys._getframe()
    while f is not None:
        if "report" in f.f_locals and "nonce" in f.f_locals:
            return f.f_locals["report"], f.f_locals["steps"], f.f_locals["i"]
        f = f.f_back
"""

ATTACKS = {
    "shadow_exec": "exec = lambda *a, **k: None\neval = lambda *a, **k: 5\n",  # the issue's example
    "patch_builtins": "import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.eval = lambda *a, **k: 5\n"
    "builtins.compile = lambda *a, **k: None\nbuiltins.BaseException = type('E', (Exception,), {})\n",
    "patch_os_sys": "import os, sys, json\nos.write = lambda fd, b: len(b)\nos._exit = lambda c: None\n"
    "sys.exit = lambda *a: None\njson.loads = lambda s: {}\n",
    "sys_exit": "import sys\nsys.exit(0)\n",
    "os_exit": "import os\nos._exit(0)\n",
    "raise_systemexit": "raise SystemExit(0)\n",
    "exit_inside_the_call": "def add(a, b):\n    import os\n    os._exit(0)\n",
    "print_fake_passes": "import sys\nfor i in range(3):\n    print('__posttrain_pass_' + str(i))\n"
    "    sys.__stdout__.write(f'{i} 0 v 5\\n')\n",
    "eq_always_true": "class A:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n"
    "def add(a, b):\n    return A()\n",
    "int_subclass_eq": "class I(int):\n    __eq__ = lambda s, o: True\ndef add(a, b):\n    return I(0)\n",
    "flood_every_fd": "import os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b'0 0 v 5\\n')\n    except OSError:\n        pass\n",
    # reads the nonce from the harness frame and reports values it chose: it does not know the expected ones
    "forge_with_the_harness_report": _FIND_REPORT + "def add(a, b):\n    report, steps, now = _report()\n"
    "    for i in range(now, len(steps)):\n        report(f'{i} 0 v 7')\n"
    "    import os\n    os._exit(0)\n",
}


def test_the_issue_example_scores_only_the_test_it_really_passes():
    code = "def add(a,b):\n return 0\nexec = lambda *a, **k: None\n"
    tests = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
    assert score(code, tests) == pytest.approx(1 / 3)  # add(-1, 1) == 0 is true of `return 0`; was 1.0


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_attacks_on_wrong_code_score_zero(attack):
    assert score(WRONG + ATTACKS[attack], SEALED) == 0.0


def test_correct_code_scores_one_and_partial_passes_the_fraction():
    assert score(RIGHT, SEALED + UNSEALED[:1]) == 1.0
    assert score("def add(a, b):\n    return a + b if a > 0 else 0\n", SEALED) == pytest.approx(2 / 3)
    # a raising test fails alone; a hanging one fails with those after it, not those before
    assert score(RIGHT, ["assert add(1, 1) == 2", "assert undefined == 1", "assert add(0, 1) == 1"]) == pytest.approx(
        2 / 3
    )
    hang = ["assert add(1, 1) == 2", "while True:\n    pass", "assert add(0, 1) == 1"]
    assert score(RIGHT, hang, wall_timeout_s=1.0) == pytest.approx(1 / 3)
    assert score("def add(a, b):\n    raise ValueError\n", SEALED) == 0.0
    assert score("syntax error (", SEALED) == 0.0


def test_tampering_with_the_report_channel_zeroes_even_correct_code():
    assert score(RIGHT + ATTACKS["flood_every_fd"], SEALED) == 0.0


def test_expected_values_never_enter_the_sandbox():
    """The oracle behind "cannot be forged": the child's program and stdin do not contain the expected values."""
    seen = []

    def spy(program, stdin):
        seen.append(program + stdin)
        return run_python(program, stdin=stdin, isolation=MODE)

    tests = ["assert add(2, 3) != 987654321", "assert 0 <= add(1, 1) < 123456789", "assert add(1, 2) in [31415926, 3]"]
    assert code_tests.run_assert_tests(RIGHT, tests, spy) == 1.0
    assert not any(v in seen[0] for v in ("987654321", "123456789", "31415926"))
    assert "add(2, 3)" in seen[0]


def test_values_cross_as_exact_literals():
    code = (
        "import numpy as np\ndef f(k):\n    return {'t1': (1,), 'empty': set(), 'nested': {1: [2.5, 'a', b'x']},"
        " 'inf': float('inf'), 'neg0': -0.0, 'true': True, 'none': None, 'float5': 5.0, 'np': np.int64(5),"
        " 'arr': np.array([1, 2]), 'fs': frozenset({3}), 'nan': float('nan'), 'obj': object()}[k]\n"
    )
    tests = [
        "assert f('t1') == (1,)",
        "assert f('empty') == set()",
        "assert f('nested') == {1: [2.5, 'a', b'x']}",
        "assert f('inf') > 1e308",
        "assert f('neg0') == 0",
        "assert f('true') == 1",
        "assert f('none') is None",
        "assert f('float5') == 5",
        "assert f('np') == 5",
        "assert f('arr') == [1, 2]",
        "assert f('fs') == {3}",
        "assert f('nan') != 1",
        "assert f('obj') != 1",
    ]
    # all pass in Python; the last two fail by design (NaN and arbitrary objects are not sent)
    assert score(code, tests) == pytest.approx(11 / 13)


def test_plan_seals_literal_comparisons_only():
    steps = plan_tests(
        [
            "x = add(1, 2)\nassert x == 3",
            "assert add(1, 2) == add(2, 1)",
            "assert add(1, 2)",
            "assert not add(0, 0) == 1 and add(1, 1) in (2, 3)",
            "assert add(0, 0) is 0",
        ]
    )
    assert [(t, kind, payload) for t, kind, payload, _ in steps] == [
        (0, "exec", "x = add(1, 2)"),
        (0, "check", ["x"]),
        (1, "exec", "assert add(1, 2) == add(2, 1)"),
        (2, "exec", "assert add(1, 2)"),
        (3, "check", ["add(0, 0)", "add(1, 1)"]),
        (4, "exec", "assert add(0, 0) is 0"),
    ]
    with pytest.raises(UserError, match=r"^code test 1 \('assert \('\) is not valid Python: "):
        plan_tests(["assert 1 == 1", "assert ("])


_LITERALS = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(-3, 3, allow_nan=False) | st.text("ab", max_size=2),
    lambda c: st.lists(c, max_size=3) | st.tuples(c, c),
    max_leaves=6,
)
_OPS = ["==", "!=", "<", "<=", ">", ">=", "in", "not in"]


@settings(max_examples=200, deadline=None)
@given(value=_LITERALS, expected=_LITERALS, op=st.sampled_from(_OPS), flip=st.booleans())
def test_trainer_side_check_agrees_with_python(value, expected, op, flip):
    """Oracle: Python's own evaluation of ``assert VALUE op EXPECTED`` (both literals, so eval is safe here)."""
    left, right = ("f()", repr(expected)) if not flip else (repr(expected), "f()")
    (step,) = plan_tests([f"assert {left} {op} {right}"])
    try:
        want = bool(eval(f"{left} {op} {right}", {"f": lambda: value}))
    except TypeError:
        want = False  # the assert raises: a failed test
    assert step[1] == "check" and _check(step[3], [ast.literal_eval(repr(value))]) == want


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="0123456789abv x\n ", max_size=80))
def test_report_parser_never_raises(text):
    steps = plan_tests(["assert f(1) == 1", "g()\nassert f(2) == 2"])
    nonce = "ab"
    got = score_reports("".join(nonce + " " + line + "\n" for line in text.split("\n")), nonce, steps, 2)
    assert got in (0.0, 0.5, 1.0)
    assert score_reports(text, nonce, steps, 2) in (0.0, 0.5, 1.0)


def test_report_parser_exact():
    steps = plan_tests(["assert f(1) == 1", "g()\nassert f(2) == 2"])
    assert score_reports("n 0 0 v 1\nn 1 ok\nn 2 0 v 2\n", "n", steps, 2) == 1.0
    assert score_reports("n 0 0 v 1\nn 1 ok\nn 2 0 v 2", "n", steps, 2) == 0.5  # cut-off last line: not counted
    assert score_reports("n 1 ok\nn 2 0 v 2\n", "n", steps, 2) == 0.5  # test 0 raised
    assert score_reports("n 0 0 v 1\nn 2 0 v 2\n", "n", steps, 2) == 0.0  # skipped a step inside a test: forged
    assert score_reports("n 0 0 v 1\nn 0 0 v 1\nn 1 ok\nn 2 0 v 2\n", "n", steps, 2) == 0.0  # duplicate
    assert score_reports("m 0 0 v 1\n", "n", steps, 2) == 0.0  # wrong nonce
    assert score_reports("n 0 0 x\nn 1 ok\nn 2 0 v 3\n", "n", steps, 2) == 0.0  # unrepresentable; wrong value


def test_known_limit_an_introspecting_candidate_forges_unsealed_tests():
    """Documented in code_tests: tests the harness runs in the child are only as strong as that harness."""
    forger = (
        WRONG
        + _FIND_REPORT
        + (
            "def add(a, b):\n    report, steps, now = _report()\n"
            "    for i in range(now, len(steps)):\n        report(f'{i} ok')\n"
            "    import os\n    os._exit(0)\n"
        )
    )
    assert score(WRONG, UNSEALED) == 0.0
    assert score(forger, UNSEALED[:1]) == 1.0


# ------------------------------------------------------------------------------------------- the tests column


def test_one_dict_for_a_row_is_refused_naming_the_row_not_read_as_two_tests():
    reward = make_code_reward(isolation=MODE)
    with pytest.raises(UserError) as e:
        reward(["p"], [""], tests=[{"input": "1 2\n", "output": "3"}])  # the row's value must be a list of them
    assert str(e.value) == (
        'code tests of row 0 must be a list of assert strings or a list of {"input": ..., "output": ...} dicts; '
        "got dict with keys ['input', 'output'] (put it in a list)"
    )
    program = "a, b = map(int, input().split())\nprint(a + b)"
    assert reward(["p"] * 2, ["", program], tests=[[{"input": "1 2\n", "output": "3"}]] * 2) == [0.0, 1.0]


def test_a_bad_row_is_refused_before_any_code_runs(monkeypatch):
    calls = []
    monkeypatch.setattr(verifiers, "run_python", lambda *a, **k: calls.append(a))
    with pytest.raises(UserError, match="^code tests of row 2 .*got str 'assert f"):
        make_code_reward(isolation=MODE)(["p"] * 3, ["x = 1"] * 3, tests=[["assert x == 1"], [], "assert f(1) == 2"])
    with pytest.raises(UserError, match=r"^code tests must be .*got dict with keys \['input', 'output'\]"):
        run_tests("print(3)", {"input": "", "output": "3"})
    assert calls == []


def _valid(value) -> bool:
    """The accepted forms, stated plainly (the oracle for check_tests)."""
    if value is None:
        return True
    if type(value) not in (list, tuple):
        return False
    if all(type(t) is str for t in value):
        return True
    return all(
        type(t) is dict and sorted(t) == ["input", "output"] and all(type(v) in (str, int, float) for v in t.values())
        for t in value
    )


_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
_io = st.fixed_dictionaries({"input": _scalars, "output": _scalars}, optional={"expected": _scalars})
_items = st.one_of(_scalars, _io, st.dictionaries(st.sampled_from(["input", "output", "x"]), _scalars, max_size=3))
_values = st.one_of(_scalars, _io, st.lists(_items, max_size=4), st.lists(_items, max_size=3).map(tuple))


@settings(max_examples=300, deadline=None)
@given(_values, st.integers(0, 10**6))
def test_check_tests_accepts_exactly_the_two_forms(value, row):
    if _valid(value):
        assert code_tests.check_tests(value, row) == ([] if value is None else list(value))
    else:
        with pytest.raises(UserError) as e:
            code_tests.check_tests(value, row)
        message = str(e.value)
        assert message.startswith(f"code tests of row {row}") and "\n" not in message
