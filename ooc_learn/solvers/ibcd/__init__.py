"""Indexed Block Coordinate Descent with truncated-loss relaxation (Yen et al., KDD 2013).

Where to find what:

- ``solver.py``: :func:`solve_ibcd`, the outer loop: the truncated-loss relaxation (eq. 5),
  run by :func:`ooc_learn.solvers.relax.outer_loop`, one convex problem per outer iteration.
- ``inner.py``: Algorithm 1 on one convex problem, :meth:`InnerLoop.run`: query the index,
  choose the block, solve it, and check every row when the index is done.
- ``solve.py``: the block problem (11) and problem (13) on the active set S (dual CD, TRON,
  and the working-set solve of a spilled S).
- ``check.py``: the convergence check of §4.3 (a sequential scan, or the pool of rows near
  the margin that the last scan kept).
- ``active_set.py``: S in memory and spilled to disk (§4.2).
- ``rows.py``: the reader the index reads its rows through (S takes the query's copies).
- ``start.py``: w_0 from a random sample, or a warm start.
- ``config.py``: :class:`IBCDConfig`, every parameter and tuned constant, validated;
  ``state.py``: the run's state and counters.
"""

from .config import IBCDConfig
from .solver import IBCDResult, solve_ibcd
from .start import sample_row_bytes

__all__ = ["IBCDConfig", "IBCDResult", "sample_row_bytes", "solve_ibcd"]
