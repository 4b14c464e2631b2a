"""`harnessrl inspect DB --rollout ID`: a rollout's session trees as a rich tree — calls (with
the API surface each came in through), agents, merges (a call that extends an earlier one) and
breaks (new roots and their cause), the cross-session edges, each completion coloured by token
class — and the calls that are in no tree: refused, failed, cancelled, discarded."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from rich.tree import Tree
from sqlalchemy import select

from harnessrl.compiler.reader import Reader
from harnessrl.samples import ACTION, ARGS, FORMAT, REASONING
from harnessrl.compiler.tokentext import TokenText
from harnessrl.db import db_url, open_db
from harnessrl.errors import UserError
from harnessrl.records import Call

STYLES = {REASONING: "cyan", ACTION: "bold red", ARGS: "green", FORMAT: "dim"}


def _coloured(tt: TokenText, ids, classes, max_chars: int) -> Text:
    out = Text()
    for tok, cls in zip(ids.tolist(), classes.tolist()):
        out.append(tt.table[tok].decode(errors="replace"), style=STYLES.get(cls, ""))
        if len(out) >= max_chars:
            out.append(" …", style="dim")
            break
    return out


def rollout_tree(db: str, rollout_id: str, tokenizer: str | None = None, max_chars: int = 400) -> Tree:
    url = db_url(db)
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        raise UserError(f"records DB not found: {db}")
    reader = Reader(open_db(db)[0], tokenizer)
    selected = reader.select_rollouts((rollout_id,))
    if not selected:
        raise UserError(f"no rollout {rollout_id!r} in {db}")
    (work,) = reader.read_batch(selected)
    with reader.engine.connect() as conn:
        rows = conn.execute(select(Call.id, Call.seq, Call.surface, Call.endpoint, Call.status, Call.error,
                                   Call.client).where(Call.rollout_id == rollout_id).order_by(Call.seq)).all()
    surface = {r.id: r.surface or r.endpoint for r in rows}
    breaks = [n.call.call_id for t in work.trees for n in t.nodes if n.parent < 0 and n.cause in ("drift", "rewrite")]
    rewrites = {cid: r["harnessrl_rewrite"] for cid, r in (reader.requests(breaks) if breaks else {}).items()
                if isinstance(r, dict) and isinstance(r.get("harnessrl_rewrite"), dict)}
    root = Tree(Text.assemble(("rollout ", "bold"), rollout_id, f"  task={work.task_id} group={work.group_id} "
                              f"calls={work.stats['calls']} failed={work.stats['failed']} ",
                              (f"errors={work.errors}", "bold red" if work.errors else ""),
                              f" retokenized={work.stats['retokenized']}"))
    legend = Text("classes: ")
    for cls, name in ((REASONING, "reasoning"), (ACTION, "action"), (ARGS, "args"), (FORMAT, "format")):
        legend.append(name + " ", style=STYLES[cls])
    root.add(legend)
    for tree in work.trees:
        agent = tree.nodes[0].call.agent
        label = Text.assemble(("session ", "bold"), tree.key, f"  agent={agent}")
        if agent == work.central:
            label.append("  (central)", style="yellow")
        if tree.key in work.edges:
            label.append(f"  ← dispatched by call {work.edges[tree.key]}", style="magenta")
        branch = root.add(label)
        handles: dict[int, Tree] = {}
        for i, node in enumerate(tree.nodes):
            c = node.call
            if node.parent < 0:
                kind = Text(f"break: new root ({node.cause})" if node.cause not in ("start",) else "root",
                            style="bold yellow" if node.cause in ("drift", "rewrite") else "")
                parent = branch
            else:
                kind = Text("merge: extends " + tree.nodes[node.parent].call.call_id, style="blue")
                parent = handles[node.parent]
            head = Text.assemble(f"call {c.call_id} seq={c.seq} {surface.get(c.call_id)} prompt={len(c.prompt)} "
                                 f"completion={len(c.completion)} ", kind)
            if c.retokenized:
                head.append(" retokenized", style="red")
            if (rw := rewrites.get(c.call_id)) is not None:  # the proxy's note: docs/methods.md §2
                how = f"rule {rw['rule']} (pass-through: use --prefix)" if rw.get("rule") else "no rewrite rule"
                head.append(f"  the harness re-sent call {rw.get('call')}'s reply in its own form: {how}",
                            style="yellow")
            handles[i] = parent.add(head)
            handles[i].add(_coloured(reader.token_text, c.completion, work.units[c.call_id].classes, max_chars))
    others = [r for r in rows if r.status != "ok"]
    if others:
        branch = root.add(Text("calls in no tree", style="bold"))
        for r in others:
            style = "red" if r.status == "error" else "dim"
            branch.add(Text.assemble(f"call {r.id} seq={r.seq} {r.surface or r.endpoint} ", (r.status, style),
                                     f": {r.error}" if r.error else "", f"  client={r.client}" if r.client else ""))
    return root
