"""A tiny random chat model (real LlamaForCausalLM + a BPE tokenizer trained here) for LLM tests."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from cptkit.llm.config import LLMConfig

CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant:{% endif %}")

TEXTS = [
    "What is the role of mitochondria in cellular respiration? Mitochondria make ATP.",
    "The capital of France is Paris. Paris is a large city on the Seine.",
    "Meiosis produces four haploid cells. Mitosis produces two identical cells.",
    "A prime number has exactly two divisors. Two is the only even prime.",
    "Newton's second law states that force equals mass times acceleration.",
    "History records the fall of Rome in the fifth century. Law governs society.",
    "Psychology studies the mind. Sociology studies society and its groups.",
    "Chemistry describes reactions between atoms. Water is made of hydrogen and oxygen.",
] * 4


def build_tiny_model(directory: Path) -> Path:
    """Train the tokenizer, build the model (seeded) and save both to ``directory``."""
    from cptkit.lm import tiny_llama, train_bpe_tokenizer

    tok = train_bpe_tokenizer(TEXTS, vocab_size=300)
    tok.chat_template = CHAT_TEMPLATE
    model = tiny_llama(tok, hidden=32, layers=2, heads=4, seed=0)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(directory))
    model.save_pretrained(str(directory))
    return directory


def llm_cfg(model_dir: Path | str, cache_dir: Path | str | None = None, **kw):
    """An ``llm`` config node for the tiny model (cache off unless ``cache_dir``)."""
    base = LLMConfig(model=str(model_dir), device="cpu", cache=cache_dir is not None,
                     cache_dir=str(cache_dir or "/nonexistent"), temperature=1.0, top_p=1.0, max_new_tokens=12)
    return OmegaConf.structured(base) if not kw else OmegaConf.merge(OmegaConf.structured(base), kw)
