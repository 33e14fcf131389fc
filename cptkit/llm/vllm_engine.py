"""vLLM's offline batched engine (``pip install 'cptkit[vllm]'``, Linux with a CUDA GPU)."""

from __future__ import annotations

from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.llm.base import Completion, Generator, GenParams, Request, apply_stop
from cptkit.llm.hf import resolve_model


class VLLMGenerator(Generator):
    backend = "vllm"

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        try:
            from vllm import LLM, SamplingParams
        except ImportError as e:
            raise CptkitError(f"llm=vllm needs the vllm package ({e.msg}): pip install 'cptkit[vllm]' "
                              "on a Linux machine with a CUDA GPU, or use llm=transformers / llm=openai") from None
        self._sampling_params = SamplingParams
        path, gguf = resolve_model(str(cfg.model), getattr(cfg, "gguf_file", None))
        model = f"{path}/{gguf}" if gguf else path
        kw: dict[str, Any] = {"tensor_parallel_size": int(cfg.tensor_parallel_size), "seed": int(cfg.seed),
                              "gpu_memory_utilization": float(cfg.gpu_memory_utilization),
                              "trust_remote_code": bool(cfg.trust_remote_code)}
        if getattr(cfg, "max_model_len", None):
            kw["max_model_len"] = int(cfg.max_model_len)
        if str(cfg.dtype) != "auto":
            kw["dtype"] = str(cfg.dtype)
        self.engine = LLM(model=model, **kw)
        self.model_id = f"{path.rstrip('/').split('/')[-1]}/{gguf}" if gguf else str(cfg.model)
        self.key_model(model)
        self.batch_size = max(self.batch_size, 256)  # vLLM schedules its own batches; this is the cache granularity

    def _generate(self, requests: list[Request], params: GenParams, seeds: list[int]) -> list[Completion]:
        sps = [self._sampling_params(max_tokens=int(params.max_new_tokens), temperature=float(params.temperature),
                                     top_p=float(params.top_p), repetition_penalty=float(params.repetition_penalty),
                                     stop=list(params.stop) or None, seed=int(s)) for s in seeds]
        as_chat = [self.chat or isinstance(r, list) for r in requests]
        outs: list[Any] = [None] * len(requests)
        ci = [i for i, c in enumerate(as_chat) if c]
        pi = [i for i, c in enumerate(as_chat) if not c]
        if ci:
            chats = [requests[i] if isinstance(requests[i], list) else
                     ([{"role": "system", "content": self.system}] if self.system else [])
                     + [{"role": "user", "content": requests[i]}] for i in ci]
            for i, o in zip(ci, self.engine.chat(chats, [sps[i] for i in ci], use_tqdm=False), strict=True):
                outs[i] = o
        if pi:
            for i, o in zip(pi, self.engine.generate([requests[i] for i in pi], [sps[i] for i in pi], use_tqdm=False), strict=True):
                outs[i] = o
        comps = []
        for o in outs:
            c = o.outputs[0]
            text, cut = apply_stop(c.text, params.stop)
            comps.append(Completion(text=text.strip(), prompt_tokens=len(o.prompt_token_ids or []),
                                    completion_tokens=len(c.token_ids),
                                    finish_reason="length" if (c.finish_reason == "length" and not cut) else "stop"))
        return comps
