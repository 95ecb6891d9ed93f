"""Derived memory: background jobs that distil the corpus (lifecycle, extraction, communities)."""
