"""The multi-hop search task shared by the planner_worker, react and langgraph_search examples:
the corpus and questions (generated, or a real corpus and QA file in JSONL), the BM25 search
tool, scoring, and export to the JSONL that `harnessrl tasks import` reads."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from harnessrl.errors import UserError
from harnessrl.harness_examples.bm25 import BM25Index
from harnessrl.harness_examples.fictional_world import QA, Doc, generate_world
from harnessrl.answer_match import exact_match, f1

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the document collection; returns the best matching documents.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string", "description": "Keywords to search for."}},
            "required": ["query"],
        },
    },
}


class SearchEnv:
    """The corpus with its BM25 index; `search` is the tool every search example exposes."""

    def __init__(self, docs: list[Doc], top_k: int = 3, max_chars: int = 300) -> None:
        if not docs:
            raise UserError("the corpus has no documents")
        self.docs, self.top_k, self.max_chars = docs, top_k, max_chars
        self.index = BM25Index([f"{d.title} {d.text}" for d in docs])

    def search(self, query: str) -> str:
        if not isinstance(query, str) or not query.strip():
            raise ValueError("'query' must be a non-empty string")
        hits = self.index.top_k(query, self.top_k)
        if not hits:
            return "No documents matched."
        return "\n".join(f"[{n}] {self.docs[i].title}: {self.docs[i].text[: self.max_chars]}"
                         for n, (i, _) in enumerate(hits, 1))


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise UserError(f"no such file: {path}")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise UserError(f"{path}:{n}: expected a JSON object")
        rows.append(row)
    return rows


def load_corpus(path: str | Path) -> list[Doc]:
    """JSONL with `text` (or `contents`) and optional `id`, `title`."""
    docs = []
    for n, row in enumerate(_read_jsonl(Path(path))):
        text = row.get("text", row.get("contents"))
        if not isinstance(text, str):
            raise UserError(f"{path}: row {n + 1} has no string 'text'")
        docs.append(Doc(str(row.get("id", n)), str(row.get("title", "")), text))
    return docs


def load_qa(path: str | Path) -> list[QA]:
    """JSONL with `question` and `answer` (a string or list; `answers`/`golden_answers` also read), optional `id`."""
    qas = []
    for n, row in enumerate(_read_jsonl(Path(path))):
        answers = row.get("answer", row.get("answers", row.get("golden_answers")))
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(row.get("question"), str) or not answers or not all(isinstance(a, str) for a in answers):
            raise UserError(f"{path}: row {n + 1} needs a string 'question' and an 'answer' (string or list of strings)")
        qas.append(QA(str(row.get("id", f"qa-{n}")), row["question"], list(answers),
                      {k: v for k, v in row.items() if k not in {"id", "question", "answer", "answers", "golden_answers"}}))
    return qas


@dataclass
class SearchTaskSet:
    env: SearchEnv
    tasks: list[QA]


def load_search_tasks(corpus: str | Path | None = None, qa: str | Path | None = None, seed: int = 0,
                      n_tasks: int | None = None, top_k: int = 3) -> SearchTaskSet:
    """A real corpus + QA file when both paths are given, else the generated fictional world."""
    if (corpus is None) != (qa is None):
        raise UserError("give both --corpus and --qa, or neither (then a fictional world is generated)")
    if corpus is None:
        docs, qas = generate_world(seed)
    else:
        docs, qas = load_corpus(corpus), load_qa(qa)
    if n_tasks is not None:
        qas = qas[:n_tasks]
    return SearchTaskSet(SearchEnv(docs, top_k=top_k), qas)


def score(answer: str, task: QA) -> dict[str, float]:
    return {"em": exact_match(answer, task.answers), "f1": f1(answer, task.answers)}


def export_tasks(tasks: list[QA], path: str | Path) -> int:
    """Write the tasks as `harnessrl tasks import` JSONL (id, input, reference, meta); returns the count."""
    with open(path, "w", encoding="utf-8") as f:
        for t in tasks:
            f.write(json.dumps({"id": t.id, "input": t.question, "reference": t.answers, "meta": t.meta}) + "\n")
    return len(tasks)
