"""On-disk layout of a store (format version 1).

A store is a directory::

    STORE/
      data.h5        rows in blocks; block = one random shard of the source rows
      index.lmdb/    optional metric forest (one tree per block), see ooc_learn.index
      meta.json      a copy of the metadata, readable without HDF5 (``ooc-info`` uses h5)

``data.h5`` datasets (n rows, d features, R blocks):

==================  ==========  ==================================================
name                dtype       content
==================  ==========  ==================================================
``y``               float32     labels: binary mapped to -1/+1, multiclass as the
                                original class values; float64 for a regression
                                target (as is: float32 would round 1e8 + x)
``row_id``          int64       position of the row in the source stream (files
                                concatenated in the order given, 0-based)
``sqnorm``          float32     squared Euclidean norm of each row
``block_offsets``   int64       R+1 row offsets; block b is rows
                                ``block_offsets[b]:block_offsets[b+1]``
``X``               float32     dense layout only: n x d (format 2: uint8 or uint16
                                codes, see ``X_values``)
``X_values``        float32     format 2 only: the value of each code of ``X``, one
                                entry per code its type has (256 or 65,536; unused
                                codes 0); attribute ``distinct``: the codes used
``indptr``          int64       CSR layout only: n+1 offsets into indices/data
``indices``         int32       CSR layout only: column of each stored value,
                                ascending within a row
``data``            float32     CSR layout only: the stored values (no explicit zeros)
==================  ==========  ==================================================

Root attributes: ``format`` = "ooc-learn-store", ``format_version`` = 1 (2 where ``X`` holds
value codes: :mod:`~ooc_learn.storage.value_codes`; both are read), ``complete`` = True
(written last), ``n_samples``, ``n_features``, ``nnz``, ``n_blocks``, ``layout``
("dense" | "csr"), ``task`` ("binary" | "regression" | "multiclass"), and JSON-encoded
``metadata`` (label map, sources with sha256 and byte counts, creation parameters).

Inside a block, rows are in the leaf order of that block's index tree when the index was built
at ingest (every leaf is one contiguous row range), else in random order.

The store directory is written under a temporary sibling name and renamed into place at the
end, so a store that did not finish never opens.
"""

FORMAT_NAME = "ooc-learn-store"
FORMAT_VERSION = 1
CODED_VERSION = 2  # a dense X held as value codes with X_values
READ_VERSIONS = (FORMAT_VERSION, CODED_VERSION)
DATA_FILE = "data.h5"
META_FILE = "meta.json"
INDEX_DIR = "index.lmdb"
TMP_MARKER = ".ooc-tmp-"
