"""The end-of-compile summary table."""

from __future__ import annotations

from typing import Any

from rich.table import Table

_ROWS = (
    ("rollouts", "rollouts"), ("calls", "calls"), ("failed", "failed calls (skipped)"),
    ("call_errors", "calls answered with an error"), ("dropped_call_error", "  rollouts left out (call errors)"),
    ("text_only", "text-only calls (skipped)"),
    ("discarded", "best_of samples not returned (skipped)"), ("embeddings", "embedding calls (not samples)"),
    ("retokenized", "retokenized calls"), ("sessions", "sessions"), ("samples", "samples"),
    ("merges", "merges (extends)"), ("roots_start", "roots: session start"), ("roots_branch", "roots: branch"),
    ("roots_drift", "new roots: drift"), ("roots_rewrite", "new roots: rewrite"),
    ("unmerged_rewrites", "new roots: unmerged harness rewrites"),
    ("untrained_sessions", "sessions not trained"), ("no_outcome", "rollouts without outcome"),
    ("skipped_no_outcome", "  left out (no outcome)"), ("singleton_groups", "groups of one rollout"),
    ("singleton_buckets", "turn buckets of one"), ("masked_truncated", "unfinished last turns masked"),
    ("policy_violations", "off-policy calls"), ("policy_dropped", "  samples dropped"),
    ("policy_masked", "  turns masked"), ("policy_flagged", "  samples flagged"),
    ("tokens_recorded", "tokens recorded (Σ|S_c|)"), ("tokens_emitted", "tokens emitted"),
    ("token_saving", "token saving"), ("trainable_tokens", "trainable tokens"),
    ("class_reasoning", "  reasoning"), ("class_action", "  action"), ("class_args", "  args"),
    ("class_format", "  format"), ("seconds", "seconds"),
)


def summary_table(totals: dict[str, Any]) -> Table:
    table = Table(title="compile summary")
    table.add_column("")
    table.add_column("value", justify="right")
    for key, label in _ROWS:
        v = totals.get(key, 0)
        table.add_row(label, f"{v:,.2f}" if isinstance(v, float) else f"{v:,}")
    if totals.get("seconds"):
        table.add_row("recorded tokens/s", f"{totals.get('tokens_recorded', 0) / totals['seconds']:,.0f}")
    return table


def summary_notes(stats: dict[str, Any]) -> list[str]:
    """Lines that say what the compile did with data it could not score as usual."""
    t, o = stats["totals"], stats["options"]
    notes = []
    if t.get("scorer_no_outcome"):  # never the policy's doing: the scorer posts an outcome for every end
        ids = [rid for rid, r in stats["rollouts"].items() if r.get("scorer_no_outcome")]
        shown = ", ".join(ids[:3]) + (", …" if len(ids) > 3 else "")
        notes.append(f"error: {t['scorer_no_outcome']:,} rollouts that harnessrl's scorer scores (hidden tests, "
                     f"--reward-from) finished without an outcome ({shown}): "
                     "a fault of the scorer, not of the policy; they are "
                     f"{'scored 0' if o.get('missing_outcome') == 'zero' else 'left out'} — please report it")
    if t.get("skipped_no_outcome"):
        ids = [rid for rid, r in stats["rollouts"].items() if r.get("skipped_no_outcome")]
        shown = ", ".join(ids[:3]) + (", …" if len(ids) > 3 else "")
        none = "no samples: " if not t.get("samples") else ""
        notes.append(f"{none}{t['skipped_no_outcome']:,} rollouts had no outcome reward: left out of the group "
                     f"statistics and the samples ({shown}). Report each one's outcome with `harnessrl reward ROLLOUT "
                     "VALUE` (through the proxy that recorded it, or with --db DB once it no longer runs), or "
                     "compile with --missing-outcome zero to score them 0")
    elif t.get("no_outcome") and o.get("missing_outcome") == "zero":
        notes.append(f"{t['no_outcome']:,} rollouts had no outcome reward: scored 0 (--missing-outcome zero)")
    if t.get("several_outcomes"):
        notes.append(f"{t['several_outcomes']:,} rollouts had several outcome rewards: the latest reported of each "
                     "was used (stats.json: `outcome` per rollout)")
    if t.get("dropped_call_error"):
        notes.append(f"{t['dropped_call_error']:,} rollouts had a call refused or failed: left out of the group "
                     "statistics and the samples (--on-call-error keep keeps them)")
    elif t.get("call_errors") and o.get("on_call_error") == "keep":
        notes.append(f"{t['call_errors']:,} calls were refused or failed in the rollouts compiled: kept "
                     "(--on-call-error keep)")
    if t.get("unmerged_rewrites"):
        notes.append(f"{t['unmerged_rewrites']:,} calls re-sent an earlier reply in the harness's own form and were "
                     "not merged on it, so their sessions split there: a proxy with --prefix merges them where a "
                     "rewrite rule recognises the form (built in: smolagents; another harness: --rewrite-pattern, "
                     "docs/methods.md §2)")
    single = t.get("singleton_groups", 0) + t.get("singleton_buckets", 0)
    if single:
        how = "advantage 0" if o["adv_config"]["singleton"] == "zero" else "their raw value as advantage"
        notes.append(f"{t.get('singleton_groups', 0):,} groups and {t.get('singleton_buckets', 0):,} turn buckets had "
                     f"a single rollout: {how} (--singleton)")
    return notes
