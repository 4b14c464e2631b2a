"""Running a rollout's command with limits, optionally in a bubblewrap sandbox: the host side, its caps and the launcher inside."""
