"""harnessrl: turn any agent harness into RL training data and train the policy on it."""

__version__ = "0.1.0"
