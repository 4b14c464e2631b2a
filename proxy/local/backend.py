"""The embedded backend: a Hugging Face causal LM run in-process (CPU by default).

Generation is our own loop over a KV cache rather than `model.generate`, so that every token
comes with the log-prob it was sampled with (vLLM's `processed_logprobs`: after temperature and
top-p) and can be streamed as it is made. One model serves every request: generation runs on a
single worker thread, one request at a time, so the event loop stays free and a weight reload
never lands in the middle of a completion.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harnessrl.errors import UserError
from harnessrl.checkpoints import LOAD_LOCK, VERSION_FILE
from harnessrl.proxy.errors import BackendRejected
from harnessrl.proxy.routes.token_backend import Completion, SamplingParams, TokenDelta

# below this temperature sampling is greedy: dividing logits by a subnormal one overflows to inf (as vLLM)
GREEDY_BELOW = 1e-5



def _version_in(path: Path) -> str | None:
    f = path / VERSION_FILE
    if not f.is_file():
        return None
    return f.read_text().strip() or None


def _load_model(path: Path):
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with LOAD_LOCK:
            return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise UserError(f"cannot load a causal LM from {path}: {str(exc).splitlines()[0]}") from exc


class LocalBackend:
    """`TokenBackend` over a local checkpoint directory (what `save_pretrained` writes)."""

    def __init__(self, model_path: str | Path, seed: int = 0, device: str = "cpu", model_name: str | None = None):
        import torch
        from transformers import AutoTokenizer

        path = Path(model_path)
        if not (path / "config.json").is_file():
            raise UserError(f"{model_path} is not a model directory (no config.json); build one with `harnessrl tiny-model DIR`")
        try:
            self._tokenizer = AutoTokenizer.from_pretrained(path)
        except (OSError, ValueError, KeyError) as exc:
            raise UserError(f"cannot load a tokenizer from {path}: {str(exc).splitlines()[0]}") from exc
        self._device = torch.device(device)
        self._base_path = path
        self._model = _load_model(path).to(self._device).eval()
        self._version = _version_in(path) or "base"
        # transformers 5.x renamed the KV-cache argument and output from `past_key_values` to `cache`
        self._cache_arg = "cache" if "cache" in inspect.signature(self._model.forward).parameters else "past_key_values"
        # the served name is the directory's (an absolute path as model id breaks SDKs that parse
        # provider/model); requests may name either, and records keep the path (`model_path`)
        self.model_name = model_name or path.resolve().name
        self.model_path = str(path.resolve())

        eos = self._model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [] if eos is None else [eos]
        self.eos_token_ids = frozenset(i for i in [self._tokenizer.eos_token_id, *eos] if i is not None)
        if not self.eos_token_ids:
            raise UserError(f"{model_path} defines no EOS token (tokenizer or generation_config)")
        self._generator = torch.Generator(device=self._device).manual_seed(seed)
        self._lock = threading.Lock()  # held for a whole completion, and to swap weights
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="harnessrl-local-backend")
        self.generated_tokens = 0  # over all requests: shows whether an abandoned generation stopped

    @property
    def weight_version(self) -> str:
        return self._version

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self._model.config.vocab_size)

    def decode(self, ids: list[int]) -> str:
        """Text of `ids` as the backend reports it: special tokens kept, no space clean-up."""
        return self._tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def render(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True) -> list[int]:
        if not self._tokenizer.chat_template:
            raise BackendRejected(f"the model {self.model_name} has no chat template: serve a checkpoint with one",
                                  status=500, code="no_chat_template")
        try:
            ids = self._tokenizer.apply_chat_template(
                messages, tools=tools or None, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
            )
        except Exception as exc:  # jinja2 errors and whatever a template raises on odd messages
            raise BackendRejected(f"cannot render the messages with the chat template: {exc}", param="messages",
                                  code="template_error") from exc
        return [int(i) for i in ids]

    def _check(self, prompt_ids: list[int], params: SamplingParams) -> None:
        config = self._model.config
        if not prompt_ids:
            raise BackendRejected("the prompt is empty")
        if params.max_tokens < 1:
            raise BackendRejected("max_tokens must be at least 1")
        if not (params.temperature >= 0 and math.isfinite(params.temperature)):
            raise BackendRejected("temperature must be a finite number >= 0")
        if not 0 < params.top_p <= 1:
            raise BackendRejected("top_p must be in (0, 1]")
        limit = getattr(config, "max_position_embeddings", None)
        if limit and len(prompt_ids) + params.max_tokens > limit:
            raise BackendRejected(
                f"this model's maximum context length is {limit} tokens; the prompt has {len(prompt_ids)} "
                f"and max_tokens is {params.max_tokens}", code="context_length_exceeded"
            )
        # after the length check: this runs on the event loop, over at most a context's worth of ids
        if any(not isinstance(i, int) or not 0 <= i < config.vocab_size for i in prompt_ids):
            raise BackendRejected(f"prompt token ids must be integers in [0, {config.vocab_size})")

    def _sample(self, logits, params: SamplingParams, generator) -> tuple[int, float, list | None]:
        """A token, its log-prob and the top-k alternatives, all under the distribution it is
        drawn from (after the constraint's mask, temperature and top-p)."""
        import torch

        if params.constraint is not None:
            params.constraint.mask(logits)
        if params.temperature < GREEDY_BELOW:
            token = int(torch.argmax(logits))
            logprobs = torch.log_softmax(logits, -1)
            return token, float(logprobs[token]), self._top(logprobs, params.top_logprobs)
        logits = logits / params.temperature
        if params.top_p < 1:
            # Keep the smallest set of most likely tokens whose mass reaches top_p, always the first:
            # a top_p that is 0 in float32 (1e-320, a fuzz finding) would drop it too (the mass
            # before it is 0 >= 0), leaving no token to draw
            ordered, order = torch.sort(logits, descending=True)
            probs = torch.softmax(ordered, -1)
            drop = torch.cumsum(probs, -1) - probs >= params.top_p
            drop[0] = False
            ordered[drop] = -math.inf
            logits = torch.full_like(logits, -math.inf).scatter(0, order, ordered)
        logprobs = torch.log_softmax(logits, -1)
        token = int(torch.multinomial(logprobs.exp(), 1, generator=generator))
        return token, float(logprobs[token]), self._top(logprobs, params.top_logprobs)

    def _top(self, logprobs, k: int) -> list[tuple[str, float]] | None:
        if not k:
            return None
        import torch

        values, ids = torch.topk(logprobs, k)
        return [(self.decode([int(i)]), float(v)) for v, i in zip(values, ids)]

    def _visible(self, text: str, stops: list[str]) -> str:
        """The part of `text` that can no longer change or be cut by a stop string."""
        text = text.rstrip("\ufffd")  # an incomplete multi-byte character
        for stop in stops:
            for n in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:n]):
                    text = text[:-n]
                    break
        return text

    def _run(self, prompt_ids: list[int], params: SamplingParams,
             emit: Callable[[TokenDelta], None] | None, cancelled: threading.Event) -> Completion:
        import torch

        with self._lock, torch.inference_mode():
            model, version = self._model, self._version
            generator = self._generator
            if params.seed is not None:
                generator = torch.Generator(device=self._device).manual_seed(params.seed)
            stops = [s for s in params.stop if s]
            ids: list[int] = []
            logprobs: list[float] = []
            tops: list[list[tuple[str, float]]] = []
            streamed = ""
            finish = "length"
            text = ""
            inputs = torch.tensor([prompt_ids], device=self._device)
            cache = None
            for step in range(params.max_tokens):
                if cancelled.is_set():
                    break
                out = model(input_ids=inputs, use_cache=True, **{self._cache_arg: cache})
                cache = out[self._cache_arg]
                token, logprob, top = self._sample(out.logits[0, -1].float(), params, generator)
                self.generated_tokens += 1
                if params.constraint is not None:
                    params.constraint.accept(token)
                ids.append(token)
                logprobs.append(logprob)
                if top is not None:
                    tops.append(top)
                inputs = torch.tensor([[token]], device=self._device)
                last = step == params.max_tokens - 1
                if token in self.eos_token_ids:
                    finish, last = "stop", True
                else:
                    text = self.decode(ids)
                    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
                    if hits:
                        text, finish, last = text[: min(hits)], "stop", True
                shown = text if last else self._visible(text, stops)
                delta = shown[len(streamed):] if shown.startswith(streamed) else ""
                streamed += delta
                if emit is not None:
                    emit(TokenDelta(token_id=token, logprob=logprob, text=delta, top=top))
                if last:
                    break
            return Completion(prompt_ids=list(prompt_ids), completion_ids=ids, logprobs=logprobs, text=text,
                              finish_reason=finish, weight_version=version,
                              top_logprobs=tops if params.top_logprobs else None)

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        self._check(prompt_ids, params)
        cancelled = threading.Event()
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._worker, self._run, prompt_ids, params, None, cancelled)
        except asyncio.CancelledError:
            cancelled.set()  # the caller went away: stop spending the worker on it
            raise

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenDelta | Completion]:
        self._check(prompt_ids, params)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()

        def put(item: object) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop is gone
                cancelled.set()

        def run() -> None:
            try:
                put(self._run(prompt_ids, params, put, cancelled))
            except BaseException as exc:  # handed to the consumer, re-raised there
                put(exc)

        loop.run_in_executor(self._worker, run)
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Completion):
                    return
        finally:
            cancelled.set()

    async def embed(self, batch: list[list[int]]) -> list[list[float]]:
        """Per input: the mean of the last hidden states over its tokens."""
        limit = getattr(self._model.config, "max_position_embeddings", None)
        for i, ids in enumerate(batch):
            if any(not 0 <= t < self.vocab_size for t in ids):
                raise BackendRejected(f"input[{i}]: token ids must be integers in [0, {self.vocab_size})",
                                      param="input")
            if limit and len(ids) > limit:
                raise BackendRejected(f"input[{i}] has {len(ids)} tokens; this model's maximum context length is "
                                      f"{limit}", param="input", code="context_length_exceeded")
        return await asyncio.get_running_loop().run_in_executor(self._worker, self._embed, batch)

    def _embed(self, batch: list[list[int]], chunk: int = 32) -> list[list[float]]:
        import torch

        out: list[list[float]] = []
        with self._lock, torch.inference_mode():
            for start in range(0, len(batch), chunk):
                part = batch[start:start + chunk]
                width = max(len(ids) for ids in part)
                # right padding: a causal model's states of real tokens never see the padding
                ids = torch.zeros((len(part), width), dtype=torch.long, device=self._device)
                mask = torch.zeros((len(part), width), dtype=torch.long, device=self._device)
                for i, row in enumerate(part):
                    ids[i, :len(row)] = torch.tensor(row, device=self._device)
                    mask[i, :len(row)] = 1
                hidden = self._model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
                m = mask.unsqueeze(-1).to(hidden.dtype)
                out.extend(((hidden * m).sum(1) / m.sum(1)).float().cpu().tolist())
        return out

    def reload(self, checkpoint_dir: str, version: str | None = None) -> str:
        """Swap in weights from `checkpoint_dir`: a full checkpoint (`save_pretrained`) or a PEFT
        LoRA adapter, merged into a fresh copy of the base weights this backend started from.
        Loading happens outside the lock; requests only wait for the swap itself. The version is
        `version`, else the directory's `harnessrl_version.txt`, else the directory name."""
        path = Path(checkpoint_dir)
        if (path / "adapter_config.json").is_file():
            model = self._merged_adapter(path)
        elif (path / "config.json").is_file():
            model = _load_model(path)
        else:
            raise UserError(f"{checkpoint_dir} holds neither a checkpoint (config.json) nor a LoRA adapter (adapter_config.json)")
        if model.config.vocab_size != self._model.config.vocab_size:
            raise UserError(f"{checkpoint_dir} has vocab size {model.config.vocab_size}, the served model "
                            f"{self._model.config.vocab_size}: not a checkpoint of this model")
        model = model.to(self._device).eval()
        new_version = version or _version_in(path) or path.resolve().name
        with self._lock:
            self._model, self._version = model, new_version
        return new_version

    def _merged_adapter(self, path: Path):
        from peft import PeftModel

        base = _load_model(self._base_path)
        try:
            with LOAD_LOCK:
                return PeftModel.from_pretrained(base, path).merge_and_unload()
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise UserError(f"cannot apply the LoRA adapter in {path}: {str(exc).splitlines()[0]}") from exc

    def close(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
