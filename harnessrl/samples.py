"""The compiled sample schema: the contract between the compiler (writes samples.parquet), the
trainer and the viewer (read it); docs/compile.md's "Sample schema" table describes each column.

One row of `samples.parquet` is one linear sample: a root-to-leaf path of a session prefix
tree (docs/methods.md §2). Token-class codes are the classes of docs/methods.md §3; 0 marks
tokens without a class (everything with loss mask 0).
"""

from __future__ import annotations

import pyarrow as pa

NONE = 0
REASONING = 1
ACTION = 2
ARGS = 3
FORMAT = 4
CLASS_NAMES = {NONE: "none", REASONING: "reasoning", ACTION: "action", ARGS: "args", FORMAT: "format"}

SAMPLE_SCHEMA = pa.schema(
    [
        ("sample_id", pa.string()),
        ("rollout_id", pa.string()),
        ("task_id", pa.string()),
        ("group_id", pa.string()),
        ("agent", pa.string()),
        ("session_id", pa.string()),
        ("input_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("token_class", pa.list_(pa.int8())),
        ("advantage", pa.list_(pa.float32())),
        ("behaviour_logprob", pa.list_(pa.float32())),
        ("turn_index", pa.list_(pa.int16())),
        ("call_ids", pa.list_(pa.string())),
        ("prompt_len", pa.int32()),
        ("weight_version", pa.string()),
        ("outcome_reward", pa.float32()),
        ("reward_breakdown", pa.string()),
        ("retokenized", pa.bool_()),
    ]
)

TASK_SCHEMA = pa.schema(
    [
        ("task_id", pa.string()),
        ("input", pa.string()),
        ("reference", pa.string()),
        ("reference_calls", pa.string()),
        ("expert_trace", pa.string()),
    ]
)
