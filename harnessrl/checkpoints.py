"""What the trainer and the local backend share about checkpoints.

- `VERSION_FILE`: a checkpoint directory's weight version, written by the trainer when it saves
  (trainer/push.py) and read by the local backend when it loads the directory, so a proxy started
  on a checkpoint (a resumed loop, a pinned evaluation) records calls under the version's name.
- `LOAD_LOCK`: one model load at a time in a process. transformers' `from_pretrained` builds the
  model under accelerate's `init_empty_weights`, which patches `torch.nn.Module.register_parameter`
  for the whole process while it runs: a load on another thread at that moment gets meta tensors
  ("Cannot copy out of meta tensor"). `loop --async` loads on several threads at once (the trainer,
  a pinned evaluation's proxy, a push's reload), so the trainer's and the local backend's loads
  take this lock."""

from __future__ import annotations

import threading

VERSION_FILE = "harnessrl_version.txt"
LOAD_LOCK = threading.Lock()
