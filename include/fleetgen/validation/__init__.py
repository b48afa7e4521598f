"""Proving a run's output complete and sane: the compact stats table and the Great Expectations suite."""
