"""The JSON bodies of the rollout API (`/harnessrl/rollouts...`, `api`), as pydantic models: FastAPI
checks them and answers a malformed one with an OpenAI-shaped 400 (`error_handlers`). The model
endpoints check their bodies by hand instead (`validate.py`)."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, field_validator


class CreateRollout(BaseModel):
    id: str | None = None  # client-chosen (the id charset and length of identities); 409 if taken
    task_id: str | None = None
    group_id: str | None = None
    run: str | None = None
    metadata: dict[str, Any] | None = None
    # who reports the outcome: "scorer" (tests, a reward command, an exit code: whoever created the
    # rollout) refuses an outcome, process reward or finish posted with the rollout's own key, so
    # its harness cannot set the reward it is trained on; kept as metadata["outcome_by"]
    outcome_by: Literal["harness", "scorer"] | None = None


class FinishIn(BaseModel):
    # why the rollout failed (a crash, a timeout, a lost node): it is finished as `failed`, which
    # compile leaves out; absent, the rollout simply finishes
    error: str | None = None


class RewardIn(BaseModel):
    value: float
    name: str | None = None
    metadata: dict[str, Any] | None = None

    @field_validator("value")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("reward value must be finite")
        return v

