"""Near-duplicate removal: MinHash + LSH + union-find, SimHash, exact (hash/Bloom), contamination.

Entry point: :func:`posttrain.data.dedup.dedup.dedup` with a :class:`DedupConfig`; the CLI is
``posttrain dedup``. See docs/dedup.md.
"""

from posttrain.data.dedup.dedup import DedupConfig, dedup

__all__ = ["DedupConfig", "dedup"]
