"""Attention and softmax ops: the backend switch used by the models lives in ``dispatch.py``."""

from posttrain.ops.dispatch import ATTENTION_BACKENDS, attention

__all__ = ["attention", "ATTENTION_BACKENDS"]
