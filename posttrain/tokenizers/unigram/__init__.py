"""Unigram language-model tokenizer (Kudo 2018, SentencePiece's default), in four modules:

- :mod:`.model`: the encoder (``UnigramModel``: Viterbi, sampling) and ``sample_encode``;
- :mod:`.seeds`: character coverage, script splitting and substring hashing (the seed vocabulary);
- :mod:`.lattice`: the flat lattice of all words and its threaded forward/backward/Viterbi sweeps (EM engine);
- :mod:`.train`: EM + pruning (``train_unigram``) and ``UnigramTrainer``.
"""

from posttrain.tokenizers.unigram.model import UNK_PENALTY, UnigramModel, sample_encode
from posttrain.tokenizers.unigram.train import UnigramTrainer, train_unigram

__all__ = ["UNK_PENALTY", "UnigramModel", "UnigramTrainer", "sample_encode", "train_unigram"]
