"""Running one rollout and where it runs: the harness registry, a command under limits, executors local and Ray, tracing from outside."""
