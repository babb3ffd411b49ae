"""Sparse regularized least squares with fast hold-out, k-fold and LOO CV."""
