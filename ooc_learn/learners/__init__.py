"""Incremental learners for TreeCV (the update/copy/score protocol)."""
