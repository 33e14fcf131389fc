"""Standard error of each topic's held-out loss at several eval sizes (topic-PPL evaluation power).

Topic-PPL reweighting (Llama-3-SynE §4.1.1) compares per-topic losses between rounds; each loss
is measured on ``train.eval_docs`` held-out docs of ``train.eval_max_tokens`` tokens. This prints,
per topic and eval size, the loss and its standard error over documents
(:func:`cptkit.models.scoring.weighted_loss_se`), and the median gap between topics' losses.

    python scripts/topic_loss_se.py --corpus DIR --model smollm2 --docs 8,32,64 --max-tokens 256
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path

from cptkit.models.lm import load_causal_lm, load_tokenizer
from cptkit.models.scoring import document_losses, weighted_loss_se


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True, help="JSONL directory (the demo corpus or its test slice)")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--group-by", default="source", help="record field used as the topic")
    ap.add_argument("--docs", default="8,32,64")
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args()
    sizes = [int(x) for x in args.docs.split(",")]
    groups: dict[str, list[str]] = {}
    for f in sorted(Path(args.corpus).glob("*.jsonl*")):
        text = gzip.decompress(f.read_bytes()).decode() if f.suffix == ".gz" else f.read_text()
        for line in text.splitlines():
            r = json.loads(line)
            groups.setdefault(str(r[args.group_by]), []).append(r["text"])
    tok, model = load_tokenizer(args.model), load_causal_lm(args.model)
    rows = []
    for g in sorted(groups):
        docs = document_losses(model, tok, groups[g][-max(sizes):], max_length=args.max_tokens,
                               max_tokens=args.max_tokens)  # the last docs: as a held-out tail
        for k in sizes:
            sub = docs[:k]
            loss = sum(s for s, _ in sub) / sum(n for _, n in sub)
            rows.append({"topic": g, "docs": k, "loss": round(loss, 4), "se": round(weighted_loss_se(sub), 4)})
    print("| topic | " + " | ".join(f"loss ± SE ({k} docs)" for k in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    for g in sorted(groups):
        cells = [f"{r['loss']:.3f} ± {r['se']:.3f}" for r in rows if r["topic"] == g]
        print(f"| {g} | " + " | ".join(cells) + " |")
    full = sorted(r["loss"] for r in rows if r["docs"] == max(sizes))
    gaps = [b - a for a, b in zip(full, full[1:], strict=False)]
    print(f"median gap between adjacent topics' losses ({max(sizes)} docs): {statistics.median(gaps):.3f}")
    for k in sizes:
        print(f"median SE at {k} docs: {statistics.median(r['se'] for r in rows if r['docs'] == k):.3f}")


if __name__ == "__main__":
    main()
