"""The public Python API: ingest (with the index), open a store, train, cross-validate."""

from __future__ import annotations

from ooc_learn.storage import ingest as _ingest
from ooc_learn.storage.store import Store, open_store

__all__ = ["ingest", "ingest_arrays", "open_store"]


def _orderer(build_index: bool, width, leaf_size):
    if not build_index:
        return None
    from ooc_learn.index.orderer import forest_orderer

    return forest_orderer(width=width, leaf_size=leaf_size)


def ingest(sources, out, *, build_index: bool = True, width: int | None = None,
           leaf_size: int | None = None, **kwargs) -> Store:
    """Ingest sources into a store with its metric-forest index (see
    :func:`ooc_learn.storage.ingest.ingest` for every other parameter).

    Parameters
    ----------
    build_index : bool
        Build the metric forest (one tree per block, rows written in leaf order).
    width, leaf_size : int, optional
        The forest's node width K (default 10) and rows per leaf (default: 16, or 32 for
        wide rows; :func:`~ooc_learn.index.tree.default_leaf_size`).

    Examples
    --------
    >>> import ooc_learn                                                    # doctest: +SKIP
    >>> store = ooc_learn.ingest(["train.svm"], "train.store", memory="512M")
    """
    orderer = _orderer(build_index, width, leaf_size)
    store = _ingest.ingest(sources, out, block_orderer=orderer, **kwargs)
    if build_index and not kwargs.get("shards"):
        from ooc_learn.index.lmdb_io import index_meta
        from ooc_learn.storage.format import INDEX_DIR

        meta = index_meta(store.path / INDEX_DIR)
        store.metadata.setdefault("index", {"width": meta["width"],
                                            "leaf_size": meta["leaf_size"]})
    return store


def ingest_arrays(X, y, out, *, build_index: bool = False, width: int | None = None,
                  leaf_size: int | None = None, **kwargs) -> Store:
    """:func:`ingest` for in-memory arrays (dense or scipy sparse ``X``)."""
    return _ingest.ingest_arrays(X, y, out, block_orderer=_orderer(build_index, width, leaf_size),
                                 **kwargs)
