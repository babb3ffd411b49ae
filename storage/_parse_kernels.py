"""Numba kernels of the streaming source parsers (driven by :mod:`.text_parser` and
:mod:`._array_sources`). One module over 500 lines on purpose: the kernels call each other (the
number scanners are inlined into both line loops, ``_sort_row`` serves the LIBSVM loop and the
array row check, all share the state offsets and status codes), and numba's on-disk cache
(``cache=True``) checks only the source file of the kernel it loads, so a kernel split from its
callees would go on loading stale compiled code after they change.

Pure functions over a ``uint8`` view of decompressed text and preallocated output arrays.
Each text kernel parses whole lines from ``st[ST_POS]`` up to ``end`` and keeps its cursor and
counters in the int64 state vector ``st`` (offsets ``ST_*``), so the driver can resume it after
it stops for one of two reasons: a bad token (status > 0, the token is located by ``ST_ERR_*``)
or a full slow-token buffer (``SLOW_FULL``).

The number scanners are inlined into the line loops (numba ``inline="always"``): faster
parsing, paid for once in compilation time.

Numbers are converted exactly. A decimal ``m * 10**e`` with integer ``m < 2**53`` and
``|e| <= 22`` is one correctly rounded multiply or divide of two exact doubles, so it equals
Python's ``float(token)`` (Clinger's fast path). Feature values only need
``float32(float(token))``; for long mantissas an approximation with relative error below
``2**-51`` decides that float32 unless it lies within ``2**-50`` of a float32 rounding
midpoint. Every other token is recorded in ``slow_*`` (byte range and destination) for the
driver to convert with Python's ``float``: labels go to ``-(row + 1)``, values to their slot.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# ---- state vector offsets ---------------------------------------------------------------
ST_POS = 0        # byte cursor (start of the next line to parse)
ST_LINE = 1       # 1-based line number at ST_POS
ST_ROWS = 2       # rows written
ST_NNZ = 3        # entries written
ST_NSLOW = 4      # slow tokens recorded
ST_MIN = 5        # smallest feature index seen (zeros included)
ST_MAX = 6        # largest feature index seen (zeros included)
ST_NZERO = 7      # explicit zeros stored (to be compacted away)
ST_ERR_LINE = 8   # line of the bad token
ST_ERR_A = 9      # byte range of the bad token (or of the bad line)
ST_ERR_B = 10
ST_ERR_COL = 11   # 1-based token (libsvm) or field (csv) number of the bad token
ST_ERR_EXTRA = 12  # duplicate index; number of fields of a wrong-width row
ST_SIZE = 16

INDEX_SENTINEL = np.int64(2**62)

# ---- status codes -----------------------------------------------------------------------
OK = 0
SLOW_FULL = -1
E_TOKEN = 1           # malformed idx:val token
E_LABEL = 2           # label not a number
E_LABEL_MISSING = 3   # first token of the line is an idx:val token
E_LABEL_NONFINITE = 4
E_VALUE_NONFINITE = 5
E_INDEX_NEG = 6
E_INDEX_BIG = 7
E_DUPLICATE = 8       # ST_ERR_EXTRA holds the index, ST_ERR_A/B the line
E_FIELD = 9           # csv field not a number
E_MISSING = 10        # csv empty field
E_WIDTH = 11          # csv row of the wrong width, ST_ERR_EXTRA holds the fields seen

# number scanner results
NUM_EXACT = 0
NUM_SLOW = 1
NUM_BAD = 2
NUM_NONFINITE = 3

MAX_INDEX = 2**31 - 1
_TWO53 = 2**53
_POW10 = np.array([10.0**k for k in range(23)], dtype=np.float64)
_BOUND = 2.0**-50

_NL = 10
_CR = 13
_SP = 32
_TAB = 9
_HASH = 35
_QUOTE = 34
_COLON = 58


_SPACE = np.zeros(256, dtype=np.bool_)
_SPACE[[_SP, _TAB, _CR, 11, 12]] = True


@njit(cache=True, nogil=True)
def _is_space(c):
    return _SPACE[c]


@njit(cache=True, nogil=True)
def _lower(c):
    return c | 32 if 65 <= c <= 90 else c


@njit(cache=True, nogil=True)
def _match_word(buf, i, end, word):
    """Length of the case-insensitive match of ``word`` (bytes as int array) at ``i``, or 0."""
    n = word.shape[0]
    if i + n > end:
        return 0
    for k in range(n):
        if _lower(buf[i + k]) != word[k]:
            return 0
    return n


_INF = np.frombuffer(b"inf", dtype=np.uint8).copy()
_INFINITY = np.frombuffer(b"infinity", dtype=np.uint8).copy()
_NAN = np.frombuffer(b"nan", dtype=np.uint8).copy()


@njit(cache=True, nogil=True)
def _float32_safe(approx):
    """True when every real within relative 2**-50 of ``approx`` rounds to one float32."""
    f = np.float32(approx)
    if not np.isfinite(f):
        return False
    up = np.float64(np.nextafter(f, np.float32(np.inf)))
    down = np.float64(np.nextafter(f, np.float32(-np.inf)))
    ff = np.float64(f)
    tol = abs(approx) * _BOUND
    return abs(approx - (ff + up) * 0.5) > tol and abs(approx - (ff + down) * 0.5) > tol


@njit(cache=True, nogil=True, inline="always")
def scan_number(buf, i, end, want_f32):
    """Scan a decimal number at ``buf[i]``; returns ``(kind, value, next_i)``.

    ``kind`` is NUM_EXACT (``value`` is ``float(token)``, or its float32 when ``want_f32``),
    NUM_SLOW (``value`` unset: let Python convert the token), NUM_BAD (no number here) or
    NUM_NONFINITE (inf/infinity/nan spelled out). The caller checks what follows ``next_i``.
    """
    neg = False
    if i < end and (buf[i] == 45 or buf[i] == 43):
        neg = buf[i] == 45
        i += 1
    if i < end and (_lower(buf[i]) == 105 or _lower(buf[i]) == 110):  # 'i' / 'n'
        k = _match_word(buf, i, end, _INFINITY)
        if k == 0:
            k = _match_word(buf, i, end, _INF)
        if k == 0:
            k = _match_word(buf, i, end, _NAN)
        if k == 0:
            return NUM_BAD, 0.0, i
        return NUM_NONFINITE, 0.0, i + k
    m = np.uint64(0)
    nd = 0
    exp10 = 0
    truncated = False
    any_digit = False
    while i < end and 48 <= buf[i] <= 57:
        d = buf[i] - 48
        any_digit = True
        if m == 0 and d == 0:
            pass
        elif nd < 19:
            m = m * np.uint64(10) + np.uint64(d)
            nd += 1
        else:
            exp10 += 1
            truncated = truncated or d != 0
        i += 1
    if i < end and buf[i] == 46:  # '.'
        i += 1
        while i < end and 48 <= buf[i] <= 57:
            d = buf[i] - 48
            any_digit = True
            if m == 0 and d == 0:
                exp10 -= 1
            elif nd < 19:
                m = m * np.uint64(10) + np.uint64(d)
                nd += 1
                exp10 -= 1
            else:
                truncated = truncated or d != 0
            i += 1
    if not any_digit:
        return NUM_BAD, 0.0, i
    if i < end and (buf[i] == 101 or buf[i] == 69):  # 'e' / 'E'
        i += 1
        eneg = False
        if i < end and (buf[i] == 45 or buf[i] == 43):
            eneg = buf[i] == 45
            i += 1
        e = 0
        any_e = False
        while i < end and 48 <= buf[i] <= 57:
            if e < 100000:
                e = e * 10 + (buf[i] - 48)
            any_e = True
            i += 1
        if not any_e:
            return NUM_BAD, 0.0, i
        exp10 += -e if eneg else e
    if m == 0:
        return NUM_EXACT, -0.0 if neg else 0.0, i
    value = 0.0
    kind = NUM_SLOW
    if not truncated and m < np.uint64(_TWO53):
        if 0 <= exp10 <= 22:
            value = np.float64(m) * _POW10[exp10]
            kind = NUM_EXACT
        elif -22 <= exp10 < 0:
            value = np.float64(m) / _POW10[-exp10]
            kind = NUM_EXACT
        elif 22 < exp10 <= 37:
            # Clinger's extension: shift zeros into the mantissa while it stays exact
            mm = np.float64(m) * _POW10[exp10 - 22]
            if mm < _TWO53:
                value = mm * _POW10[22]
                kind = NUM_EXACT
    if kind == NUM_SLOW and want_f32 and -22 <= exp10 <= 22:
        approx = np.float64(m) * _POW10[exp10] if exp10 >= 0 else np.float64(m) / _POW10[-exp10]
        if _float32_safe(approx):
            value = approx
            kind = NUM_EXACT
    if neg:
        value = -value
    if kind == NUM_EXACT and want_f32:
        value = np.float64(np.float32(value))
    return kind, value, i


@njit(cache=True, nogil=True)
def count_two(buf, a, b, c1, c2):
    """Occurrences of the bytes ``c1`` and ``c2`` in ``buf[a:b]``, in one (vectorised) pass."""
    n1 = 0
    n2 = 0
    for i in range(a, b):
        c = buf[i]
        n1 += c == c1
        n2 += c == c2
    return n1, n2


@njit(cache=True, nogil=True)
def _skip_to_eol(buf, i, end):
    while i < end and buf[i] != _NL:
        i += 1
    return i


@njit(cache=True, nogil=True)
def _token_end(buf, i, end):
    while i < end and not _is_space(buf[i]) and buf[i] != _NL and buf[i] != _HASH:
        i += 1
    return i


# One signature, given up front: called with constant codes, a lazily typed ``_fail`` would be
# compiled once for every combination of literal arguments
@njit("int64(int64[::1], int64, int64, int64, int64, int64, int64)", cache=True, nogil=True)
def _fail(st, code, line, a, b, col, extra):
    st[ST_ERR_LINE] = line
    st[ST_ERR_A] = a
    st[ST_ERR_B] = b
    st[ST_ERR_COL] = col
    st[ST_ERR_EXTRA] = extra
    return code


@njit(cache=True, nogil=True)
def _argsort(keys):
    """A permutation that sorts ``keys`` (heapsort: O(n log n), not stable).

    Written out because ``np.argsort`` compiles numba's merge sort into the parser's first
    run; equal keys are a duplicate feature, which the caller refuses anyway.
    """
    n = keys.shape[0]
    order = np.arange(n)
    # the first n // 2 steps build the heap (sift each inner node down); each later step moves
    # the heap's top to the end of the shrinking heap and sifts the new root down
    half = n // 2
    for step in range(half + n - 1):
        if step < half:
            root = half - 1 - step
            size = n
        else:
            size = n - 1 - (step - half)
            order[0], order[size] = order[size], order[0]
            root = 0
        top = order[root]
        while True:
            child = 2 * root + 1
            if child >= size:
                break
            if child + 1 < size and keys[order[child + 1]] > keys[order[child]]:
                child += 1
            if keys[order[child]] <= keys[top]:
                break
            order[root] = order[child]
            root = child
        order[root] = top
    return order


@njit(cache=True, nogil=True)
def _sort_row(indices, values, a, b, slow_target, s0, s1):
    """Sort entries ``[a, b)`` by index, remap slow slots ``[s0, s1)``; return a duplicate or -1."""
    order = _argsort(indices[a:b])
    idx = indices[a:b].copy()
    val = values[a:b].copy()
    inv = np.empty(b - a, dtype=np.int64)
    for k in range(b - a):
        indices[a + k] = idx[order[k]]
        values[a + k] = val[order[k]]
        inv[order[k]] = k
    for s in range(s0, s1):
        if slow_target[s] >= 0:
            slow_target[s] = a + inv[slow_target[s] - a]
    for k in range(a + 1, b):
        if indices[k] == indices[k - 1]:
            return indices[k]
    return -1


@njit(cache=True, nogil=True, inline="always")
def _scan_index(buf, i, end):
    """Scan ``[+-]digits`` of a feature index; returns ``(ok, negative, too_big, index, i)``."""
    neg = False
    if i < end and (buf[i] == 45 or buf[i] == 43):
        neg = buf[i] == 45
        i += 1
    idx = 0
    big = False
    any_digit = False
    while i < end and 48 <= buf[i] <= 57:
        any_digit = True
        if not big:
            idx = idx * 10 + (buf[i] - 48)
            big = idx > MAX_INDEX
        i += 1
    return any_digit, neg and idx != 0, big, idx, i


@njit(cache=True, nogil=True)
def parse_libsvm(buf, end, st, labels, indptr, indices, values, line_numbers,
                 slow_a, slow_b, slow_target):
    """Parse LIBSVM/svmlight lines ``buf[st[ST_POS]:end]`` (``end`` just after a newline).

    Returns OK, SLOW_FULL (resume after converting the slow tokens) or an ``E_*`` code.
    """
    pos = st[ST_POS]
    line = st[ST_LINE]
    rows = st[ST_ROWS]
    nnz = st[ST_NNZ]
    nslow = st[ST_NSLOW]
    slow_cap = slow_a.shape[0]
    lo = st[ST_MIN]
    hi = st[ST_MAX]
    while pos < end:
        line_start = pos
        while _is_space(buf[pos]):
            pos += 1
        c = buf[pos]
        if c == _NL or c == _HASH:
            pos = _skip_to_eol(buf, pos, end) + 1
            line += 1
            continue
        row_nnz0 = nnz
        row_slow0 = nslow
        tok = pos
        kind, v, pos = scan_number(buf, pos, end, False)
        c = buf[pos]
        if not (_is_space(c) or c == _NL or c == _HASH) or kind == NUM_BAD:
            te = _token_end(buf, tok, end)
            code = E_LABEL_MISSING if c == _COLON and kind != NUM_NONFINITE else E_LABEL
            return _fail(st, code, line, tok, te, 1, 0)
        if kind == NUM_NONFINITE:
            return _fail(st, E_LABEL_NONFINITE, line, tok, pos, 1, 0)
        if kind == NUM_SLOW:
            if nslow == slow_cap:
                pos = line_start
                break
            slow_a[nslow] = tok
            slow_b[nslow] = pos
            slow_target[nslow] = -(rows + 1)
            nslow += 1
        labels[rows] = v
        line_numbers[rows] = line
        col = 1
        prev = -1
        is_sorted = True
        full = False
        while True:
            while _is_space(buf[pos]):
                pos += 1
            c = buf[pos]
            if c == _NL or c == _HASH:
                pos = _skip_to_eol(buf, pos, end) + 1
                break
            col += 1
            tok = pos
            if c == 113 and pos + 4 <= end and buf[pos + 1] == 105 and buf[pos + 2] == 100 \
                    and buf[pos + 3] == _COLON:  # "qid:"
                ok, neg, big, q, pos = _scan_index(buf, pos + 4, end)
                c = buf[pos]
                if not ok or not (_is_space(c) or c == _NL or c == _HASH):
                    return _fail(st, E_TOKEN, line, tok, _token_end(buf, tok, end), col, 0)
                continue
            ok, neg, big, idx, pos = _scan_index(buf, pos, end)
            if not ok or buf[pos] != _COLON:
                return _fail(st, E_TOKEN, line, tok, _token_end(buf, tok, end), col, 0)
            if neg:
                return _fail(st, E_INDEX_NEG, line, tok, _token_end(buf, tok, end), col, 0)
            if big:
                return _fail(st, E_INDEX_BIG, line, tok, _token_end(buf, tok, end), col, 0)
            vtok = pos + 1
            kind, v, pos = scan_number(buf, vtok, end, True)
            c = buf[pos]
            if kind == NUM_BAD or not (_is_space(c) or c == _NL or c == _HASH):
                return _fail(st, E_TOKEN, line, tok, _token_end(buf, tok, end), col, 0)
            if kind == NUM_NONFINITE:
                return _fail(st, E_VALUE_NONFINITE, line, tok, pos, col, 0)
            if idx == prev:
                return _fail(st, E_DUPLICATE, line, tok, pos, col, idx)
            if idx < prev:
                is_sorted = False
            prev = idx
            lo = min(lo, idx)
            hi = max(hi, idx)
            if kind == NUM_SLOW:
                if nslow == slow_cap:
                    full = True
                    break
                slow_a[nslow] = vtok
                slow_b[nslow] = pos
                slow_target[nslow] = nnz
                nslow += 1
            elif v == 0.0:
                st[ST_NZERO] += 1
            indices[nnz] = idx
            values[nnz] = v
            nnz += 1
        if full:
            nnz = row_nnz0
            nslow = row_slow0
            pos = line_start
            break
        if not is_sorted:
            dup = _sort_row(indices, values, row_nnz0, nnz, slow_target, row_slow0, nslow)
            if dup >= 0:
                return _fail(st, E_DUPLICATE, line, line_start, _skip_to_eol(buf, line_start, end),
                             0, dup)
        rows += 1
        indptr[rows] = nnz
        line += 1
    st[ST_POS] = pos
    st[ST_LINE] = line
    st[ST_ROWS] = rows
    st[ST_NNZ] = nnz
    st[ST_NSLOW] = nslow
    st[ST_MIN] = lo
    st[ST_MAX] = hi
    return SLOW_FULL if pos < end else OK


@njit(cache=True, nogil=True)
def _field_end(buf, i, end, delim):
    while i < end and buf[i] != _NL and buf[i] != delim and not (delim < 0 and _is_space(buf[i])):
        i += 1
    return i


@njit(cache=True, nogil=True)
def parse_csv(buf, end, st, delim, n_fields, label_col, text_label, labels, indptr, indices,
              values, line_numbers, slow_a, slow_b, slow_target):
    """Parse delimited numeric lines (``delim`` a byte, or -1 for runs of whitespace).

    Field ``label_col`` is the label; the others are features numbered 0.. in order. With
    ``text_label`` the label is a class name: its byte range goes to the slow tokens (target
    ``-(row + 1)``) for the driver to map to a class code.
    Returns OK, SLOW_FULL or an ``E_*`` code, like :func:`parse_libsvm`.
    """
    pos = st[ST_POS]
    line = st[ST_LINE]
    rows = st[ST_ROWS]
    nnz = st[ST_NNZ]
    nslow = st[ST_NSLOW]
    slow_cap = slow_a.shape[0]
    while pos < end:
        line_start = pos
        while _is_space(buf[pos]) and buf[pos] != delim:
            pos += 1
        c = buf[pos]
        if c == _NL or c == _HASH:
            pos = _skip_to_eol(buf, pos, end) + 1
            line += 1
            continue
        pos = line_start
        row_nnz0 = nnz
        row_slow0 = nslow
        field = 0
        full = False
        while True:
            while _is_space(buf[pos]) and buf[pos] != delim:
                pos += 1
            tok = pos
            c = buf[pos]
            if c == delim or c == _NL:
                if delim < 0:
                    break
                return _fail(st, E_MISSING, line, tok, tok, field + 1, 0)
            quoted = 0
            if text_label and field == label_col:
                pos = _field_end(buf, pos, end, delim)
                kind, v = NUM_SLOW, 0.0
            else:
                kind, v, pos = scan_number(buf, pos, end, field != label_col)
                if kind == NUM_BAD and c == _QUOTE:
                    # "1.5", as R's write.csv and spreadsheets quote fields
                    kind, v, pos = scan_number(buf, tok + 1, end, field != label_col)
                    if kind == NUM_BAD or buf[pos] != _QUOTE:
                        kind = NUM_BAD
                    else:
                        quoted = 1
                        tok += 1
            te = pos
            pos += quoted
            while pos < end and _is_space(buf[pos]) and buf[pos] != delim:
                pos += 1
            c = buf[pos]
            if kind == NUM_BAD or not (c == delim or c == _NL or (delim < 0 and te < pos)):
                tok -= quoted
                te = _field_end(buf, tok, end, delim)
                return _fail(st, E_FIELD, line, tok, te, field + 1, 0)
            if kind == NUM_NONFINITE:
                code = E_LABEL_NONFINITE if field == label_col else E_VALUE_NONFINITE
                return _fail(st, code, line, tok, te, field + 1, 0)
            if field >= n_fields:
                return _fail(st, E_WIDTH, line, line_start, _skip_to_eol(buf, pos, end),
                             field + 1, field + 1)
            if kind == NUM_SLOW:
                if nslow == slow_cap:
                    full = True
                    break
                slow_a[nslow] = tok
                slow_b[nslow] = te
                slow_target[nslow] = -(rows + 1) if field == label_col else nnz
                nslow += 1
            if field == label_col:
                labels[rows] = v
            elif kind == NUM_SLOW or v != 0.0:
                indices[nnz] = field if field < label_col else field - 1
                values[nnz] = v
                nnz += 1
            field += 1
            if c == _NL:
                break
            if delim >= 0:
                pos += 1
        if full:
            nnz = row_nnz0
            nslow = row_slow0
            pos = line_start
            break
        if field != n_fields:
            return _fail(st, E_WIDTH, line, line_start, _skip_to_eol(buf, pos, end), field,
                         field)
        pos += 1
        line_numbers[rows] = line
        rows += 1
        indptr[rows] = nnz
        line += 1
    st[ST_POS] = pos
    st[ST_LINE] = line
    st[ST_ROWS] = rows
    st[ST_NNZ] = nnz
    st[ST_NSLOW] = nslow
    return SLOW_FULL if pos < end else OK


@njit(cache=True, nogil=True)
def drop_zeros(indptr, indices, values):
    """Remove entries whose value is 0 in place; returns the new nnz (``indptr`` updated)."""
    w = 0
    start = 0
    for r in range(indptr.shape[0] - 1):
        stop = indptr[r + 1]
        for k in range(start, stop):
            if values[k] != 0:
                indices[w] = indices[k]
                values[w] = values[k]
                w += 1
        start = stop
        indptr[r + 1] = w
    return w


@njit(cache=True, nogil=True)
def sort_check_rows(indptr, indices, values, n_cols):
    """Sort each CSR row by index in place; returns ``(code, row, index)`` of the first problem.

    ``code`` is 0 (fine), E_INDEX_NEG, E_INDEX_BIG (index >= ``n_cols``) or E_DUPLICATE.
    """
    for r in range(indptr.shape[0] - 1):
        a = indptr[r]
        b = indptr[r + 1]
        is_sorted = True
        for k in range(a, b):
            if indices[k] < 0:
                return E_INDEX_NEG, r, indices[k]
            if indices[k] >= n_cols:
                return E_INDEX_BIG, r, indices[k]
            if k > a and indices[k] <= indices[k - 1]:
                is_sorted = False
        if not is_sorted:
            dup = _sort_row(indices, values, a, b, indptr[:0], 0, 0)
            if dup >= 0:
                return E_DUPLICATE, r, dup
    return 0, -1, -1


@njit(cache=True, nogil=True)
def dense_to_csr(X, indptr):
    """The nonzeros of the float32 rows ``X`` as CSR: ``indptr`` (len m + 1) is filled, and
    ``(indices int64, values float32)`` returned. Two branch-free passes over X (count, then
    copy every entry and advance past the nonzero ones), where a mask, ``np.nonzero`` and
    fancy indexing make five."""
    m, d = X.shape
    indptr[0] = 0
    for i in range(m):
        c = 0
        for j in range(d):
            c += X[i, j] != 0
        indptr[i + 1] = indptr[i] + c
    nnz = indptr[m]
    indices = np.empty(nnz + 1, np.int64)  # one slot past the end: the last write lands there
    values = np.empty(nnz + 1, np.float32)
    e = 0
    for i in range(m):
        for j in range(d):
            v = X[i, j]
            indices[e] = j
            values[e] = v
            e += v != 0
    return indices[:nnz], values[:nnz]


@njit(cache=True, nogil=True)
def dense_row_stats(X, sq):
    """One pass over the float32 rows ``X``: their squared norms (summed in float64) into
    ``sq``; returns ``(non-zeros, first row holding a NaN or infinite value, or -1)``. A
    float32's square is finite in float64, so a row's sum is finite exactly when its values
    are: the norms a store keeps double as the check of its values."""
    m, d = X.shape
    nnz = 0
    bad = -1
    for i in range(m):
        s = 0.0
        for j in range(d):
            v = np.float64(X[i, j])
            s += v * v
            nnz += v != 0
        sq[i] = s
        if bad < 0 and not np.isfinite(s):
            bad = i
    return nnz, bad
