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


QUESTIONS = ["What is the role of mitochondria in cellular respiration?", "Why is two the only even prime number?",
             "How does meiosis differ from mitosis?", "What does Newton's second law state?",
             "Why did Rome fall in the fifth century?", "What does sociology study?",
             "How are hydrogen and oxygen bonded in water?", "What is the capital of France?"]
SENTENCES = [t.split(". ")[0].rstrip(".") + "." for t in TEXTS[:8]]
KEYWORDS = ["biology", "mathematics", "history", "physics", "sociology", "chemistry", "law", "medicine"]
DISCIPLINES = ["biology", "mathematics", "computer science", "physics", "general education", "chemistry",
               "astronomy", "medical science"]


def training_pairs() -> list[tuple[str, str]]:
    """(user prompt, response) pairs: each prompt prefix maps to one response shape."""
    s2 = SENTENCES * 2
    pairs = []
    for i, q in enumerate(QUESTIONS):
        pairs += [(f"Ask: {q}", QUESTIONS[(i + 1) % 8]),
                  (f"What is {KEYWORDS[i]}?", q),
                  (f"Answer: {q}", f"###Answer### {s2[i]} ###COT### {s2[i + 1]}"),
                  (f"Make a {DISCIPLINES[i]} problem: {TEXTS[i][:60]}", f"[Problem] {q} [Solution] {s2[i]} {s2[i + 1]}"),
                  (f"Like these: [Problem 1]\n{q}\n\n[Problem 2]\n{QUESTIONS[(i + 5) % 8]} Write a new programming problem.",
                   f"[Problem] {QUESTIONS[(i + 3) % 8]} Return the answer."),
                  (f"Solve: {q}", f"[Solution] {s2[i]} {s2[i + 1]}")]
    return pairs


def build_tiny_model(directory: Path, train_steps: int = 600) -> Path:
    """Train the tokenizer, build the model (seeded), teach it the response shapes of the tests'
    short prompts (questions, ###Answer###/###COT###, [Problem]/[Solution], ending with EOS), save."""
    import torch

    from cptkit.models.tiny import tiny_llama, train_bpe_tokenizer

    torch.set_num_threads(1)  # tiny matrices: one thread is many times faster on a busy machine
    pairs = training_pairs()
    tok = train_bpe_tokenizer(TEXTS + [p + " " + r for p, r in pairs], vocab_size=300)
    tok.chat_template = CHAT_TEMPLATE
    model = tiny_llama(tok, hidden=64, layers=2, heads=4, seed=0, max_position=4096)
    if train_steps:
        seqs = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
                + " " + r + "</s>" for q, r in pairs]
        enc = tok(seqs, return_tensors="pt", padding=True, add_special_tokens=False)
        labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
        g = torch.Generator().manual_seed(0)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        model.train()
        for _ in range(train_steps):
            idx = torch.randint(0, len(seqs), (8,), generator=g)
            loss = model(input_ids=enc["input_ids"][idx], attention_mask=enc["attention_mask"][idx],
                         labels=labels[idx]).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        model.eval()
    directory.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(directory))
    model.save_pretrained(str(directory))
    return directory


def cached_tiny_model() -> Path:
    """The tiny model, built once and kept under ~/.cache/cptkit/test-tiny-llm/<hash of this file>."""
    import hashlib
    import os
    import shutil
    import tempfile

    key = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    root = Path(os.environ.get("CPTKIT_TEST_CACHE", os.path.expanduser("~/.cache/cptkit/test-corpus"))).parent
    final = root / "test-tiny-llm" / key
    if (final / "config.json").exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=".build-"))
    try:
        build_tiny_model(tmp / "m")
        try:
            os.rename(tmp / "m", final)
        except OSError:  # a concurrent session finished first
            if not (final / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def llm_cfg(model_dir: Path | str, cache_dir: Path | str | None = None, **kw):
    """An ``llm`` config node for the tiny model (cache off unless ``cache_dir``)."""
    base = LLMConfig(model=str(model_dir), device="cpu", num_threads=1, cache=cache_dir is not None,
                     cache_dir=str(cache_dir or "/nonexistent"), temperature=1.0, top_p=1.0, max_new_tokens=12)
    return OmegaConf.structured(base) if not kw else OmegaConf.merge(OmegaConf.structured(base), kw)
