"""Attention and softmax ops.

``attention(..., backend=...)`` in ``dispatch.py`` is the one entry point the models use; the
backends live one per file: ``naive.py`` (naive oracle, hand backward), ``flash.py``
(tiled, O(N) memory; its readable twin and oracle is ``flash_reference.py``, the textbook
recurrence), ``triton_attention.py`` (GPU kernels).  ``softmax.py`` holds softmax,
its hand backward and the online variants.  ``memory.py`` measures the peak memory of a call.
"""

from posttrain.ops.dispatch import ATTENTION_BACKENDS, attention
from posttrain.ops.flash import flash_attention

__all__ = ["attention", "ATTENTION_BACKENDS", "flash_attention"]
