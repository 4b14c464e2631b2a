"""Rollouts: their API (`api`, with its request bodies in `bodies`), their rows (create, rewards,
finish: `store`) and the cache of their statuses that the hot path checks (`status`)."""
