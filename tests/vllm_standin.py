"""A stand-in for a vLLM OpenAI server, speaking vLLM's wire format with real token ids from
the tiny tokenizer (vLLM cannot run without a GPU).

What it mimics (vLLM >= 0.10.2 plus the weight-version extension):
- chat: `prompt_token_ids` (top level; streams: first chunk), `choices[].token_ids` (streams: the
  chunk's delta ids, EOS included in the last one), `choices[].logprobs.content[].logprob`,
  hermes tool calls parsed into `tool_calls`, `weight_versions: [{version, start, end}]` per choice
  when `return_weight_versions` (streams: on the terminal chunk), usage chunk on `include_usage`;
- completions: string or token-id prompt, `choices[].prompt_token_ids` / `token_ids`,
  `logprobs.token_logprobs`, `skip_special_tokens`;
- embeddings: a deterministic 8-float vector per input (string or token ids).

It "samples" like a model rather than a tokenizer: completion ids are the reply tokenized in
3-character pieces and tool-call JSON is written compactly, so re-rendering the reply through
the chat template gives different ids (token drift), as real models do.

Error hooks by model name: "fail-500", "fail-400", "slow" (sleeps 5 s); malformed answers with
status 200: "bad-ids" (a token id that is a string), "bad-usage" (usage a string), "bad-chunk"
(a stream chunk that is not JSON, after the first content chunk), "no-choices" (`choices: null`,
streams too), "slow-stream" (50 ms between streamed chat tokens); "nul-output" answers text
holding U+0000 (as models sometimes do). Answers that end as if complete but are not (issue 30; tests/standin_faults.py),
chosen by model name or by "[fault:NAME]" anywhere in the prompt (so a `--prefix` proxy, which
names the served model itself, can ask for them): "error-mid-stream" (streams: content chunks,
then vLLM's streaming error `data: {"error": {...}}`, then `[DONE]`; else that error object as a
200 body), "no-finish" (no finish reason: streams end with `[DONE]` after content chunks whose
finish_reason is null), "abort" (finish_reason "abort": vLLM's aborted request), "non-sse" (`{"choices":[]}` as application/json, streams too), "garbage"
(an HTML page, streams too), "truncated-json" (the body, or the stream's third event, cut in the
middle, then the connection ends). vLLM's reload API (`/collective_rpc` reload_weights,
`/v1/load_lora_adapter`, `/reset_prefix_cache`) changes the weight version it reports; a stream
that a reload overtakes reports two version spans. With `api_key` it answers 401 to any request without
`Authorization: Bearer <api_key>` (vLLM's `--api-key`) and keeps the Authorization headers it
was sent in `app.state.auth_seen`. Given `served` names (`--served-model-name`) it answers others
(hooks aside) with vLLM's 404 NotFoundError; else it takes any name. Run as a process:
`python tests/vllm_standin.py --tokenizer DIR --port 8001 [--api-key KEY] [--scripted] [--served-model-name NAME]`.

Scripted mode (`--scripted`, `create_app(..., scripted=True)`): the reply is what
tests/scripted_agent.py answers to the rendered prompt, so a real harness (Claude Code, Codex, ...)
runs its agent loop to the end: a call of its shell tool, then an answer quoting the output.
`--commands FILE` (JSON [[needle, shell line], ...]): the shell call of a task holding a needle
runs that line first (a scripted edit, tests/test_coding_cli.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
import zlib
from pathlib import Path

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from scripted_agent import answer as scripted_answer
from standin_faults import WHOLE_BODY_FAULTS, answer, fault_body, fault_of, faulty
from starlette.responses import Response, StreamingResponse

WEIGHT_VERSION = "standin-v1"
_WORDS = ["alpha", "beta", "gamma", "delta", "paris", "river", "engine", "answer"]


def _err(status: int, message: str, type_: str = "BadRequestError") -> Response:
    body = {"error": {"message": message, "type": type_, "param": None, "code": status}}
    return Response(orjson.dumps(body), status, media_type="application/json")


class StandIn:
    def __init__(self, tokenizer_dir: str, scripted: bool = False, served: tuple[str, ...] | None = None,
                 commands: tuple[tuple[str, str], ...] = ()) -> None:
        from transformers import AutoTokenizer

        self.scripted = scripted
        self.commands = commands
        self.served = served
        self.tok = AutoTokenizer.from_pretrained(tokenizer_dir)
        self.version = WEIGHT_VERSION  # changed by a reload (vLLM's reload_weights / load_lora_adapter)
        self.reloads = 0
        self.eos = self.tok.eos_token_id
        self._prompts: dict[bytes, list[int]] = {}
        self._replies: dict[tuple, tuple[list[int], list[float]]] = {}
        self._pieces: dict[tuple, list[str]] = {}
        self._texts: dict[tuple, str] = {}

    # ---- "model" ------------------------------------------------------------------------
    def chat_prompt(self, messages: list, tools: list | None) -> list[int]:
        key = orjson.dumps([messages, tools])
        ids = self._prompts.get(key)
        if ids is None:
            msgs = [{**m, "content": _flat(m.get("content"))} for m in messages]
            text = self.tok.apply_chat_template(msgs, tools=tools or None, tokenize=False, add_generation_prompt=True)
            ids = self._prompts[key] = self.tok.encode(text, add_special_tokens=False)
        return ids

    def reply(self, prompt_ids: list[int], response_format: dict | None = None) -> tuple[list[int], list[float]]:
        """Like a model, answers from the prompt alone: with tool schemas in it, a tool call
        (until three tool results came back), else a short answer. Scripted: what
        `scripted_agent.answer` says to the prompt (a real harness's agent loop)."""
        key = (tuple(prompt_ids), orjson.dumps(response_format) if self.scripted else None)
        got = self._replies.get(key)
        if got is not None:
            return got
        if self.scripted:
            text = scripted_answer(self.tok.decode(prompt_ids), response_format, self.commands)
        else:
            text = self._free_text(prompt_ids)
        ids: list[int] = []
        for special in ("<think>", "</think>", "<tool_call>", "</tool_call>"):
            text = text.replace(special, f"\0{special}\0")
        for part in text.split("\0"):
            if part in ("<think>", "</think>", "<tool_call>", "</tool_call>"):
                ids += self.tok.convert_tokens_to_ids([part])
            else:  # 3-character pieces: valid ids for the text, but not the tokenizer's own split
                for i in range(0, len(part), 3):
                    ids += self.tok.encode(part[i:i + 3], add_special_tokens=False)
        ids.append(self.eos)
        lps = [-((t * 7919) % 1000) / 250.0 - 0.01 for t in ids]
        self._replies[key] = (ids, lps)
        return ids, lps

    def _free_text(self, prompt_ids: list[int]) -> str:
        h = zlib.crc32(str(prompt_ids).encode())
        word, num = _WORDS[h % len(_WORDS)], h % 1000
        prompt = self.tok.decode(prompt_ids)
        tools = re.search(r"<tools>\n(.*)\n", prompt)
        if tools and prompt.count("<tool_response>") < 3:
            name = orjson.loads(tools.group(1)).get("name", "tool")
            return (f"<think>\nI should look up {word}.\n</think>\n\n<tool_call>\n"
                    f'{{"name":"{name}","arguments":{{"key":"{word}","n":{num}}}}}\n</tool_call>')
        return f"The answer is {word} {num}."

    def pieces(self, ids: list[int], skip_special: bool = False) -> list[str]:
        """The text each token adds (what a streaming detokenizer emits), cached per reply."""
        key = (tuple(ids), skip_special)
        got = self._pieces.get(key)
        if got is None:
            got, prev = [], ""
            for i in range(len(ids)):
                now = self.tok.decode(ids[: i + 1], skip_special_tokens=skip_special)
                got.append(now[len(prev):])
                prev = now
            self._pieces[key] = got
        return got

    def _prompt_text(self, prompt: list[int]) -> str:
        """A token-id prompt's text, only to look for a "[fault:NAME]" marker (cached)."""
        key = tuple(prompt)
        got = self._texts.get(key)
        if got is None:
            got = self._texts[key] = self.tok.decode(prompt)
        return got

    def text(self, ids: list[int], skip_special: bool) -> str:
        if ids and ids[-1] == self.eos:
            ids = ids[:-1]
        return self.tok.decode(ids, skip_special_tokens=skip_special)

    # ---- endpoints ----------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        raw = await request.body()
        req = orjson.loads(raw)
        model = req.get("model") or "standin"
        if bad := await self._hooks(model):
            return bad
        fault = fault_of(model, raw.decode("utf-8", "replace") if b"[fault:" in raw else "")
        if fault in WHOLE_BODY_FAULTS:
            return fault_body(fault)
        tools = req.get("tools") if req.get("tool_choice") != "none" else None
        prompt = self.chat_prompt(req["messages"], req.get("tools"))
        ids, lps = self.reply(prompt, req.get("response_format"))
        max_tokens = req.get("max_completion_tokens") or req.get("max_tokens") or 1 << 30
        finish = "stop"
        if len(ids) > max_tokens:
            ids, lps, finish = ids[:max_tokens], lps[:max_tokens], "length"
        from harnessrl.proxy.routes.hermes_tools import parse_hermes

        full = self.text(ids, skip_special=False)
        content, calls = parse_hermes(full) if tools else (full, [])
        if calls and finish == "stop":
            finish = "tool_calls"
        opts = _Opts(req)
        if req.get("stream"):
            return StreamingResponse(faulty(self._chat_stream(req, model, prompt, ids, lps, content, calls, finish,
                                                               opts), fault), media_type="text/event-stream")
        msg = {"role": "assistant", "content": content, "reasoning": None}
        if calls:
            msg["tool_calls"] = calls
        choice = {"index": 0, "message": msg, "finish_reason": finish, "stop_reason": None,
                  "logprobs": self._chat_lp(ids, lps) if req.get("logprobs") else None}
        if opts.ids:
            choice["token_ids"] = ids
        if opts.versions:
            choice["weight_versions"] = [{"version": self.version, "start": 0, "end": len(ids)}]
        body = {"id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion", "created": int(time.time()),
                "model": model, "choices": [choice], "usage": _usage(prompt, ids),
                "prompt_token_ids": prompt if opts.ids else None}
        return answer(_malformed(body, model), fault)

    def _chat_lp(self, ids: list[int], lps: list[float]) -> dict:
        return {"content": [{"token": self.tok.convert_ids_to_tokens(t), "logprob": lp, "bytes": None,
                             "top_logprobs": []} for t, lp in zip(ids, lps)]}

    async def _chat_stream(self, req, model, prompt, ids, lps, content, calls, finish, opts):
        base = {"id": f"chatcmpl-{time.time_ns()}", "object": "chat.completion.chunk", "created": int(time.time()),
                "model": model}
        started_on = self.version  # a reload mid-stream gives the call two version spans, as vLLM's do

        def chunk(delta, tids, finish_reason=None, at=(), top=None, extra=None):
            ch = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            if req.get("logprobs") and tids:
                ch["logprobs"] = self._chat_lp(tids, [lps[i] for i in at])
            if opts.ids:
                ch["token_ids"] = tids
            ch.update(extra or {})
            return b"data: " + orjson.dumps({**base, **(top or {}), "choices": [ch]}) + b"\n\n"

        first = {"role": "assistant", "content": ""}
        yield chunk(first, [], top={"prompt_token_ids": prompt} if opts.ids else {})
        # text tokens one per chunk until the tool call; the tool call in one chunk (like the
        # hermes streaming parser's final flush); EOS on the terminal chunk
        n_text = len(ids) - 1 if ids and ids[-1] == self.eos else len(ids)
        streamed = ""
        i = 0
        for piece in self.pieces(ids[:n_text]):
            if calls and "<tool_call>" in (streamed + piece):
                break
            streamed += piece
            if model == "slow-stream":
                await asyncio.sleep(0.05)
            yield chunk({"content": piece}, [ids[i]], at=[i])
            if model == "bad-chunk":
                yield b"data: {not json\n\n"
            i += 1
        if calls:
            rest = list(range(i, n_text))
            yield chunk({"tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]},
                        [ids[j] for j in rest], at=rest)
        last = list(range(n_text, len(ids)))
        spans = [{"version": started_on, "start": 0, "end": len(ids)}]
        if self.version != started_on:
            spans = [{"version": started_on, "start": 0, "end": len(ids) - 1},
                     {"version": self.version, "start": len(ids) - 1, "end": len(ids)}]
        extra = {"weight_versions": spans} if opts.versions else {}
        yield chunk({}, [ids[j] for j in last], finish, at=last, extra=extra)
        if opts.usage:
            yield b"data: " + orjson.dumps({**base, "choices": [], "usage": _usage(prompt, ids)}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def completions(self, request: Request) -> Response:
        req = orjson.loads(await request.body())
        model = req.get("model") or "standin"
        if bad := await self._hooks(model):
            return bad
        p = req["prompt"]
        if isinstance(p, list) and p and isinstance(p[0], str):
            p = p[0]
        prompt = self.tok.encode(p) if isinstance(p, str) else list(p)
        fault = fault_of(model, p if isinstance(p, str) else self._prompt_text(prompt))
        if fault in WHOLE_BODY_FAULTS:
            return fault_body(fault)
        ids, lps = self.reply(prompt, req.get("response_format"))
        max_tokens = req.get("max_tokens") or 16
        finish = "stop"
        if len(ids) > max_tokens:
            ids, lps, finish = ids[:max_tokens], lps[:max_tokens], "length"
        skip = req.get("skip_special_tokens", True)
        opts = _Opts(req)
        want_lp = req.get("logprobs") is not None
        if req.get("stream"):
            return StreamingResponse(faulty(self._completion_stream(model, prompt, ids, lps, finish, skip, opts,
                                                                     want_lp), fault), media_type="text/event-stream")
        choice = {"index": 0, "text": self.text(ids, skip), "finish_reason": finish, "stop_reason": None,
                  "logprobs": self._text_lp(ids, lps) if want_lp else None}
        if opts.ids:
            choice["prompt_token_ids"], choice["token_ids"] = prompt, ids
        if opts.versions:
            choice["weight_versions"] = [{"version": self.version, "start": 0, "end": len(ids)}]
        body = {"id": f"cmpl-{time.time_ns()}", "object": "text_completion", "created": int(time.time()),
                "model": model, "choices": [choice], "usage": _usage(prompt, ids)}
        return answer(_malformed(body, model), fault)

    def _text_lp(self, ids, lps) -> dict:
        return {"text_offset": [], "token_logprobs": lps, "tokens": self.tok.convert_ids_to_tokens(ids),
                "top_logprobs": [None] * len(ids)}

    async def _completion_stream(self, model, prompt, ids, lps, finish, skip, opts, want_lp):
        base = {"id": f"cmpl-{time.time_ns()}", "object": "text_completion", "created": int(time.time()),
                "model": model}
        n_text = len(ids) - 1 if ids and ids[-1] == self.eos else len(ids)
        texts = self.pieces(ids[:n_text], skip) + [""] * (len(ids) - n_text)
        for i, t in enumerate(ids):
            last = i == len(ids) - 1
            ch = {"index": 0, "text": texts[i], "finish_reason": finish if last else None,
                  "logprobs": self._text_lp([t], [lps[i]]) if want_lp else None}
            if opts.ids:
                ch["token_ids"] = [t]
                if i == 0:
                    ch["prompt_token_ids"] = prompt
            if last and opts.versions:
                ch["weight_versions"] = [{"version": self.version, "start": 0, "end": len(ids)}]
            yield b"data: " + orjson.dumps({**base, "choices": [ch]}) + b"\n\n"
            if model == "bad-chunk":
                yield b"data: {not json\n\n"
        if opts.usage:
            yield b"data: " + orjson.dumps({**base, "choices": [], "usage": _usage(prompt, ids)}) + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def embeddings(self, request: Request) -> Response:
        """A deterministic 8-dimensional vector per input (floats only, as vLLM's default)."""
        req = orjson.loads(await request.body())
        x = req["input"]
        inputs = [x] if isinstance(x, str) or (x and isinstance(x[0], int)) else x
        data, n = [], 0
        for i, item in enumerate(inputs):
            ids = self.tok.encode(item) if isinstance(item, str) else list(item)
            n += len(ids)
            h = zlib.crc32(str(ids).encode())
            data.append({"object": "embedding", "index": i, "embedding": [((h >> k) % 97) / 97.0 for k in range(8)]})
        return Response(orjson.dumps({"object": "list", "data": data, "model": req.get("model") or "standin",
                                      "usage": {"prompt_tokens": n, "total_tokens": n}}),
                        media_type="application/json")

    async def reload(self, request: Request) -> Response:
        """vLLM's reload API: `POST /collective_rpc` (reload_weights: the version becomes the
        checkpoint directory's name, as `trainer/push.save_checkpoint` names them),
        `POST /v1/load_lora_adapter` (the adapter's name), `POST /reset_prefix_cache`."""
        body = orjson.loads(await request.body() or b"null")
        if request.url.path == "/collective_rpc":
            if body.get("method") != "reload_weights":
                return _err(400, f"unknown method {body.get('method')!r}")
            self.version = str(body["kwargs"]["weights_path"]).rstrip("/").rsplit("/", 1)[-1]
            self.reloads += 1
        elif request.url.path == "/v1/load_lora_adapter":
            self.version = str(body["lora_name"])
            self.reloads += 1
        return Response(b"{}", media_type="application/json")

    async def _hooks(self, model: str) -> Response | None:
        if model == "fail-500":
            return _err(500, "injected upstream failure", "InternalServerError")
        if model == "fail-400":
            return _err(400, "injected bad request")
        if model == "slow":
            await asyncio.sleep(5)
        if model == "no-choices":  # an error sent as a 200 (seen from overloaded gateways)
            return Response(orjson.dumps({"object": "error", "message": "overloaded", "choices": None}),
                            media_type="application/json")
        if self.served is not None and model not in self.served and model not in _HOOKS:
            return _err(404, f"The model `{model}` does not exist.", "NotFoundError")
        return None


_HOOKS = {"fail-500", "fail-400", "slow", "no-choices", "bad-ids", "bad-usage", "bad-chunk", "slow-stream",
          "nul-output", "error-mid-stream", "no-finish", "abort", "non-sse", "garbage", "truncated-json"}


class _Opts:
    __slots__ = ("ids", "versions", "usage")

    def __init__(self, req: dict) -> None:
        self.ids = bool(req.get("return_token_ids"))
        self.versions = bool(req.get("return_weight_versions"))
        self.usage = bool((req.get("stream_options") or {}).get("include_usage"))


def _malformed(body: dict, model: str) -> dict:
    if model == "nul-output":
        ch = body["choices"][0]
        if "message" in ch:
            ch["message"]["content"] = "before\x00after \uffff0"
        else:
            ch["text"] = "before\x00after \uffff0"
    elif model == "bad-ids" and body["choices"][0].get("token_ids") is not None:
        body["choices"][0]["token_ids"] = [*body["choices"][0]["token_ids"], "x"]
    elif model == "bad-usage":
        body["usage"] = "lots"
    return body


def _flat(content) -> str:
    """A message's content as vLLM hands it to a "string"-format chat template: text parts joined by newlines."""
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content or ""


def _usage(prompt: list[int], ids: list[int]) -> dict:
    return {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)}


def create_app(tokenizer_dir: str, api_key: str | None = None, scripted: bool = False,
               served: tuple[str, ...] | None = None, commands: tuple[tuple[str, str], ...] = ()) -> FastAPI:
    s = StandIn(tokenizer_dir, scripted, served, commands)
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.state.auth_seen = []
    if api_key is not None:
        @app.middleware("http")
        async def _key(request: Request, call_next):
            app.state.auth_seen.extend(request.headers.getlist("authorization"))
            if request.headers.getlist("authorization") != [f"Bearer {api_key}"]:
                return _err(401, "Unauthorized", "AuthenticationError")
            return await call_next(request)

    app.add_route("/v1/chat/completions", s.chat, methods=["POST"])
    app.add_route("/v1/completions", s.completions, methods=["POST"])
    app.add_route("/v1/embeddings", s.embeddings, methods=["POST"])
    for path in ("/collective_rpc", "/reset_prefix_cache", "/v1/load_lora_adapter"):
        app.add_route(path, s.reload, methods=["POST"])
    app.state.standin = s

    async def models(_request: Request) -> Response:
        names = s.served or ("standin",)
        return Response(orjson.dumps({"object": "list", "data": [{"id": n, "object": "model"} for n in names]}),
                        media_type="application/json")

    app.add_route("/v1/models", models, methods=["GET"])
    return app


def run_standin(tokenizer_dir: str, app: FastAPI | None = None, port: int = 0):
    """The stand-in (or `app`, one made by `create_app`) on a free port (or `port`) in a
    background thread; a context manager yielding its base URL."""
    from asgi_thread import serve_in_thread

    return serve_in_thread(app or create_app(tokenizer_dir), loop="uvloop", http="httptools", port=port)


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--api-key", default=None, help="require this bearer key, like vLLM's --api-key")
    ap.add_argument("--scripted", action="store_true", help="answer like an agent (tests/scripted_agent.py)")
    ap.add_argument("--served-model-name", action="append", default=None,
                    help="refuse other model names with vLLM's 404 (repeatable)")
    ap.add_argument("--commands", default=None, help="scripted mode: JSON [[needle, shell line], ...] (scripted_agent.py)")
    args = ap.parse_args()
    commands = tuple(tuple(pair) for pair in json.loads(Path(args.commands).read_text())) if args.commands else ()
    app = create_app(args.tokenizer, args.api_key, args.scripted, tuple(args.served_model_name or ()) or None,
                     commands)
    uvicorn.run(app, host=args.host, port=args.port, loop="uvloop", http="httptools", log_level="warning",
                access_log=False, backlog=4096)


if __name__ == "__main__":
    main()
