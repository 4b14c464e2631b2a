"""Rollouts: the rows (create, rewards, finish) and the cache of their statuses that the hot path
checks."""
