"""One rollout and where it runs: the harness registry, a command under limits, local and Ray executors, tracing."""
