"""Near-duplicate removal: MinHash + LSH + union-find, SimHash, exact (hash/Bloom), contamination.

Entry point: :func:`posttrain.data.dedup.run.dedup` with a :class:`DedupConfig`; the CLI is
``posttrain dedup``. See docs/dedup.md.
"""

from posttrain.data.dedup.run import DedupConfig, dedup

__all__ = ["DedupConfig", "dedup"]
