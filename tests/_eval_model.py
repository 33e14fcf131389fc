"""A tiny real model for the evaluate tests: byte-level BPE trained on real text + a seeded tiny Llama.

The training text is Debian copyright files plus the eval fixtures themselves (so digits, code and
Chinese have tokens); the model is saved like a ``train`` checkpoint and loaded back from disk.
"""

from __future__ import annotations

import glob
from pathlib import Path

from cptkit.models import tiny

FIXTURES = Path(__file__).parent / "fixtures" / "eval"
TASK_DIR = Path(__file__).parent.parent / "conf" / "eval" / "tasks"


def training_texts(n: int = 160) -> list[str]:
    out = []
    for f in sorted(glob.glob("/usr/share/doc/*/copyright")):
        t = Path(f).read_text(errors="replace").strip()
        if len(t) > 400:
            out.append(t[:3000])
        if len(out) == n:
            break
    assert len(out) >= 60, "needs Debian copyright files under /usr/share/doc"
    for f in sorted(FIXTURES.rglob("*")):
        if f.is_file() and f.suffix in (".json", ".jsonl", ".csv", ".xml", ".txt"):
            out.append(f.read_text(encoding="utf-8")[:4000])
    return out


def make_tiny(directory: Path, seed: int = 11):
    """``(model dir, tokenizer, model)``, saved to ``directory``."""
    tok = tiny.train_bpe_tokenizer(training_texts(), vocab_size=800)
    model = tiny.tiny_llama(tok, hidden=64, layers=2, heads=4, max_position=2048, seed=seed)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    return directory, tok, model
