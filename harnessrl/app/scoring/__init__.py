"""A coding rollout's reward: the task's workspace, the clean room and the hidden tests run in a fresh sandbox."""
