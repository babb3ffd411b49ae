"""Metric-forest index over a store: one tree per block, persisted in LMDB.

Knows vectors and trees, not losses. Installed as ``ooc_learn.index``.
"""
