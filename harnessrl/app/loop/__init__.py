"""The loop: rounds of rollouts, compile, train, push and evaluate (`harnessrl loop`)."""
