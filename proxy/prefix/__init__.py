"""Prefix consistency (docs/methods.md §2): the index of earlier turns a call may extend, the
volatile spans held at a session's first values, and the prompt built as an exact extension."""
