"""Known-item search on the Chinese documents of the demo corpus: CJK unigrams (what
Elasticsearch's standard analyzer does with Han characters, UAX#29) vs CJK bigrams (cptkit's
default, Lucene's CJKAnalyzer).

Queries are contiguous runs of ``--chars`` Han characters taken at a seeded random position from
1000 random Chinese documents (``lang == "zh"``); a query "finds" its document when the document
ranks first (top-1) / by reciprocal rank within the top 10 (MRR@10). BM25 ``idf=lucene`` with the
defaults (k1 = 1.2, b = 0.75), the same index code for both tokenizations.

    python bench/cjk_tokenization.py --corpus /work/data/corpus --chars 8
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cptkit.core.shards import read_records, resolve_inputs  # noqa: E402
from cptkit.index.base import BM25Params  # noqa: E402
from cptkit.index.bm25 import BM25Index  # noqa: E402
from cptkit.text.tokenize import Tokenizer  # noqa: E402

HAN_RUN = re.compile(r"[\u4e00-\u9fff]{12,}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--chars", type=int, default=8, help="Han characters per query (at most 12)")
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    docs = [r["text"] for inp in resolve_inputs(args.corpus) for r in read_records(inp) if r.get("lang") == "zh"]
    rng = random.Random(args.seed)
    queries, src = [], []
    for i in rng.sample(range(len(docs)), len(docs)):
        runs = HAN_RUN.findall(docs[i])
        if not runs:
            continue
        run = rng.choice(runs)
        s = rng.randrange(len(run) - 11)
        queries.append(run[s:s + min(args.chars, 12)])
        src.append(i)
        if len(queries) == args.queries:
            break
    print(f"{len(docs)} Chinese documents, {len(queries)} queries of {args.chars} Han characters")
    print("| tokenizer.cjk | top-1 | MRR@10 |\n|---|---|---|")
    for mode in ("unigram", "bigram"):
        tok = Tokenizer({"cjk": mode})
        idx = BM25Index.build([tok(d) for d in docs], BM25Params(idf="lucene"))
        res = idx.search([tok(q) for q in queries], 10)
        top1 = mrr = 0.0
        for qi, d in enumerate(src):
            hits = res.docs[qi, :res.counts[qi]].tolist()
            top1 += bool(hits) and hits[0] == d
            mrr += 1 / (hits.index(d) + 1) if d in hits else 0.0
        print(f"| {mode} | {top1 / len(queries):.3f} | {mrr / len(queries):.3f} |")


if __name__ == "__main__":
    main()
