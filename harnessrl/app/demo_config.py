"""`harnessrl demo`'s settings, apart from `demo.py` so that the CLI reads its defaults without
importing torch. Measured in docs/changelog.md (issue 41: the demo)."""

ALGO = "capo"  # the project's own method (Harness-RL's CAPO)
ROUNDS = 3
SFT_STEPS = 600  # warm-start SFT steps, lr 1e-3, batch 8, from the untrained tiny model (no imprint)
GROUP = 8  # rollouts per training task per round
BATCH = 32  # samples per optimizer step: every rollout once a round
ITEMS = 8  # the toolbox world's first 8 items: 16 training tasks, 16 held out (each item's other two attributes)
CONFUSE = {"color": "size", "size": "owner", "owner": "city", "city": "color"}  # the expert's cycle, as the bench's
TRACES, RIGHT = 5, 2  # expert lines per training task, and how many of them call the right tool
DRILL = 3  # times the copy drill (find(item), two phrasings) is in the warm start's data
