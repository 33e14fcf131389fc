"""The one word/CJK tokenizer (cptkit.text.tokenize): every preset gives, token for token, what its
consumer's own regex gave before they were unified. The old definitions are copied here verbatim
as the reference; a varied multilingual sample and a seeded random-Unicode fuzz must agree."""

from __future__ import annotations

import json
import random
import re
import shutil

import pytest
from mixdata import make_tokenizer

from cptkit.dedup import minhash as mh
from cptkit.demo.sources import base
from cptkit.eval import contamination
from cptkit.labels.backends import fasttext as classify
from cptkit.synthetic import qa as synthesis
from cptkit.text import tokenize as T
from cptkit.text.rust_tokenizer import load_rust_tokenizer

# --- the reference: the definitions as they were, copied ----------------------------------------
_MH_CJK = "\u2e80-\u2fdf\u3040-\u30ff\u3100-\u312f\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
OLD_MINHASH = {"words": re.compile(rf"[{_MH_CJK}]|[^\W{_MH_CJK}]+"), "whitespace": re.compile(r"\S+")}

_SY_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
OLD_SYNTHESIS = re.compile(rf"[{_SY_CJK}]|[^\W{_SY_CJK}]+(?:['’][^\W{_SY_CJK}]+)*")

_FT_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
OLD_FT_V1 = re.compile(rf"[{_FT_CJK}]|[^\W\d_]+|\d+|[^\w\s]")
OLD_FT = re.compile(rf"[{_FT_CJK}]|[^\W_{_FT_CJK}]+|[^\w\s]")
OLD_FT_ASCII = re.compile(r"[a-z0-9]+|[^\sa-z0-9_]")

OLD_CONTAMINATION = re.compile(r"\w+", re.UNICODE)

OLD_CJK_CLASS = (
    "\u1100-\u11ff\u3040-\u309f\u30a0-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002ebef"
)
_OLD_CJK_ANY = re.compile(f"[{OLD_CJK_CLASS}]")
_OLD_CJK_SPLIT = re.compile(f"([{OLD_CJK_CLASS}]+)")

OLD_DEMO_CJK = re.compile(r"[\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef\u3000-\u303f]")
OLD_DEMO_GAP = re.compile(r"(?<=[\u4e00-\u9fff，。、；：？！）」』]) (?=[\u4e00-\u9fff，。、；：？！（「『])")


def old_fasttext_line(text: str, max_chars: int = 4000) -> str:
    t = text[:max_chars].lower()
    if t.isascii():
        return " ".join(OLD_FT_ASCII.findall(t))
    return " ".join(OLD_FT.findall(t))


def old_fasttext_line_v1(text: str, max_chars: int = 4000) -> str:
    return " ".join(OLD_FT_V1.findall(text[:max_chars].lower()))


def old_ascii_table(tokenizer: str, lowercase: bool) -> bytes:
    word = set(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
    table = []
    for c in range(256):
        if lowercase and 65 <= c <= 90:
            table.append(c + 32)
        elif tokenizer == "words":
            table.append(c if c in word else 32)
        else:
            table.append(32 if 0x1C <= c <= 0x1F else c)
    return bytes(table)


def old_token_bytes(text: str, tokenizer: str, lowercase: bool) -> bytes:
    if text.isascii():
        return text.encode("ascii").translate(old_ascii_table(tokenizer, lowercase))
    return " ".join(OLD_MINHASH[tokenizer].findall(text.lower() if lowercase else text)).encode("utf-8")


def old_bm25(text: str, lowercase=True, split=r"\W+", cjk="bigram", cjk_unigrams=False, stopwords=(), min_length=1):
    def grams(run):
        if cjk == "unigram" or len(run) == 1:
            return list(run)
        g = [run[i:i + 2] for i in range(len(run) - 1)]
        return g + list(run) if cjk_unigrams else g

    stop = frozenset(w.lower() if lowercase else w for w in stopwords)
    if lowercase:
        text = text.lower()
    toks = [t for t in re.split(split, text) if t]
    if cjk != "none" and _OLD_CJK_ANY.search(text):
        out = []
        for t in toks:
            if not _OLD_CJK_ANY.search(t):
                out.append(t)
                continue
            for i, part in enumerate(_OLD_CJK_SPLIT.split(t)):
                if part:
                    out.extend(grams(part) if i % 2 else [part])
        toks = out
        if min_length > 1:
            toks = [t for t in toks if len(t) >= min_length or _OLD_CJK_ANY.match(t)]
    elif min_length > 1:
        toks = [t for t in toks if len(t) >= min_length]
    return [t for t in toks if t not in stop] if stop else toks


# --- the inputs ----------------------------------------------------------------------------------
SAMPLE = [
    "",
    "   \t\n ",
    "Don't stop: it's rock 'n' roll, l’eau d’été — O'Neil's 1990s ''quoted'' ' lone",
    "Hello, WORLD! foo_bar __init__ 3.14 abc123 x2y 1,000,000 v1.2.3 e-mail a_b_ _",
    "Punctuation... (a) [b] {c} <d> #e $f %g ^h &i *j +k =l |m ~n `o` \"p\" ;q: @r! ?s",
    "机器学习是人工智能的一个分支。我们在Debian系统上使用python教程，很好！",
    "日本語のテキスト：ひらがな、カタカナ、漢字を混ぜた文です。ｶﾀｶﾅ半角",
    "한국어 텍스트입니다. ㅋㅋㅋ ㅎㅎ 자모 ᄀᄁ 한글",
    "mixed python教程 and 中文English混合 abc中文123 学习2024年",
    "emoji 👍🏽 👨‍👩‍👧 ❤️ 🇩🇪 smile😀ok",
    "combining: e\u0301 a\u0308 Ünïcode-ß İstanbul ǅ ﬁne Kelvin \u212a x\u20dd",
    "radicals ⼈⼤⺀ ⿰ bopomofo ㄅㄆㄇ fullwidth ＡＢＣ１２３！ ideographic\u3000space 「引用」",
    "supplementary 𠀀𠀁𪜶 a𠀀b 𝐀𝐁 Ⅻ ½ ² ٣ 一二三",
    "Арабский عربى हिन्दी देवनागरी ไทย ελληνικά",
    "ASCII controls \x00\x01\x1c\x1d\x1e\x1f\x7f tab\tvt\x0bff\x0ccr\r end",
    "Hello, World! foo_bar 3.14",
    "Python 的列表 list",
    "量子力学 is fun",
]

_RANGES = [  # every block edge in the old and new classes, with its neighbours
    0x1100, 0x11FF, 0x2E80, 0x2FDF, 0x3000, 0x303F, 0x3040, 0x309F, 0x30A0, 0x30FF, 0x3100, 0x312F,
    0x3130, 0x318F, 0x3400, 0x4DBF, 0x4E00, 0x9FFF, 0xAC00, 0xD7AF, 0xF900, 0xFAFF, 0xFF00, 0xFFEF,
    0x20000, 0x2EBEF,
]
EDGES = "".join(chr(c + d) for c in _RANGES for d in (-1, 0, 1))
POOL = ("abcXYZ019_ \t\n'’.,!?-()\"#\x1c\x1f" + EDGES + "é\u0301\u0308İ\u212aß👍🏽\u200d")


def _fuzz(n: int, seed: int, ascii_only: bool = False) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        k = rng.randrange(0, 40)
        if ascii_only:
            out.append("".join(chr(rng.randrange(0, 128)) for _ in range(k)))
            continue
        chars = []
        for _ in range(k):
            r = rng.random()
            if r < 0.35:
                chars.append(rng.choice(POOL))
            elif r < 0.55:
                chars.append(chr(rng.randrange(0, 0x250)))
            elif r < 0.8:
                c = rng.randrange(0, 0x10000)
                chars.append(chr(c) if not 0xD800 <= c <= 0xDFFF else "x")
            else:
                chars.append(chr(rng.randrange(0x10000, 0x30000)))
        out.append("".join(chars))
    return out


TEXTS = SAMPLE + [EDGES, POOL] + _fuzz(3000, seed=1234) + _fuzz(1000, seed=99, ascii_only=True)


# --- the presets against the reference ------------------------------------------------------------
def test_the_presets():
    assert set(T.WORD_PRESETS) == {"contamination", "bm25", "minhash", "whitespace", "synthesis", "fasttext",
                                   "fasttext_v1"}
    with pytest.raises(ValueError, match="unknown word tokenizer"):
        T.word_tokenizer("nope")
    assert T.word_tokenizer("synthesis")("Don't stop 机器") == ["Don't", "stop", "机", "器"]
    assert T.word_tokenizer("minhash")("Don't stop 机器") == ["don", "t", "stop", "机", "器"]
    assert T.word_tokenizer("contamination")("Don't stop 机器") == ["don", "t", "stop", "机", "器"]
    assert T.word_tokenizer("bm25")("Don't stop 机器") == ["don", "t", "stop", "机器"]
    assert T.word_tokenizer("fasttext")("Don't stop 机器 abc123") == ["don", "'", "t", "stop", "机", "器", "abc123"]
    assert T.word_tokenizer("fasttext_v1")("Don't stop 机器 abc123") == ["don", "'", "t", "stop", "机", "器", "abc", "123"]
    assert T.word_tokenizer("whitespace")("a,b  C") == ["a,b", "c"]


def test_cjk_class_is_the_old_one():
    for t in TEXTS:
        assert T._CJK_ANY.findall(t) == _OLD_CJK_ANY.findall(t)


@pytest.mark.parametrize("name", ["words", "whitespace"])
def test_minhash_tokens_and_token_bytes(name):
    for lowercase in (True, False):
        sh = mh.Shingler(tokenizer=name, lowercase=lowercase)
        for t in TEXTS:
            old = OLD_MINHASH[name].findall(t.lower() if lowercase else t)
            assert mh.tokenize(t, name, lowercase) == old, t
            assert sh.token_bytes(t) == old_token_bytes(t, name, lowercase), t
    preset = T.word_tokenizer("minhash" if name == "words" else "whitespace")
    for t in TEXTS:
        assert preset(t) == OLD_MINHASH[name].findall(t.lower())


def test_synthesis_words():
    for t in TEXTS:
        assert synthesis.words(t) == OLD_SYNTHESIS.findall(t), t
        assert T.word_tokenizer("synthesis")(t) == OLD_SYNTHESIS.findall(t)
        old_cut = [m.end() for m in OLD_SYNTHESIS.finditer(t)]
        assert [m.end() for m in T.word_tokenizer("synthesis").regex.finditer(t)] == old_cut


def test_fasttext_lines_v1_and_v2_with_the_ascii_path():
    for t in TEXTS:
        for max_chars in (4000, 7):
            assert classify.fasttext_line(t, max_chars) == old_fasttext_line(t, max_chars), t
            assert classify.fasttext_line_v1(t, max_chars) == old_fasttext_line_v1(t, max_chars), t
        low = t.lower()
        assert T.word_tokenizer("fasttext")(t) == OLD_FT.findall(low)  # the ASCII path gives the general tokens
        if low.isascii():
            assert OLD_FT_ASCII.findall(low) == OLD_FT.findall(low)


def test_contamination_words():
    # the \\w+ runs of lm-eval's decontamination between CJK characters, and each CJK character alone
    cjk = f"[{T.CJK_CLASS}]"
    for t in TEXTS:
        pieces = re.split(f"({cjk})", t.lower())
        want = [w for i, p in enumerate(pieces) for w in ([p] if i % 2 else OLD_CONTAMINATION.findall(p))]
        assert contamination.words(t) == want, t


@pytest.mark.parametrize("cfg", [{}, {"cjk_unigrams": True}, {"cjk": "unigram"}, {"cjk": "none"},
                                 {"min_length": 2, "stopwords": ["The", "机器"]}, {"lowercase": False},
                                 {"split": r"[\s,]+"}, {"split": r"\s+", "min_length": 3}])
def test_bm25_terms(cfg):
    tok = T.Tokenizer(cfg)
    for t in TEXTS:
        assert tok(t) == old_bm25(t, **cfg), t
    if not cfg:
        assert all(T.word_tokenizer("bm25")(t) == old_bm25(t) for t in TEXTS)


def test_demo_corpus_cjk_detection():
    for t in TEXTS:
        assert base.has_cjk(t) == (OLD_DEMO_CJK.search(t) is not None)
        letters = sum(1 for c in t if c.isalpha())
        assert base.cjk_share(t) == (len(OLD_DEMO_CJK.findall(t)) / letters if letters else 0.0)
        spaced = " ".join(t)
        assert base.join_cjk(spaced) == OLD_DEMO_GAP.sub("", spaced)


def test_no_second_cjk_definition():
    """Only cptkit/text/tokenize.py spells a CJK block (escapes of the blocks' first code points)."""
    from pathlib import Path

    pkg = Path(T.__file__).resolve().parent.parent
    starts = ["\\u3040", "\\u3400", "\\u4e00", "\\uac00", "\\u2e80", "\\U00020000"]
    bad = [str(p.relative_to(pkg)) for p in pkg.rglob("*.py")
           if p.name != "tokenize.py" and any(s in p.read_text(encoding="utf-8") for s in starts)]
    assert not bad, bad


def test_rust_tokenizer_gives_transformers_ids(corpus_records, tmp_path):
    """build-mix reads a generic tokenizer.json folder with ``tokenizers`` alone: the same ids (one text
    and a batch, Chinese included), EOS id and vocabulary size as transformers' AutoTokenizer; a folder
    transformers would change (another class, its own settings) is left to transformers."""
    from cptkit.models.lm import load_tokenizer  # here: it imports torch

    d = make_tokenizer(corpus_records, tmp_path / "bpe")
    rust, hf = load_rust_tokenizer(str(d)), load_tokenizer(str(d))
    assert rust is not None
    texts = [r["text"] for r in corpus_records[::7]]
    assert rust(texts, add_special_tokens=False)["input_ids"] == \
        hf(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
    assert rust(texts[-1], add_special_tokens=False)["input_ids"] == hf(texts[-1], add_special_tokens=False)["input_ids"]
    assert (len(rust), rust.eos_token_id) == (len(hf), hf.eos_token_id)
    for change in ({"tokenizer_class": "LlamaTokenizer"}, {"add_prefix_space": True}, {"eos_token": None}):
        other = tmp_path / f"other{len(list(tmp_path.iterdir()))}"
        shutil.copytree(d, other)
        cfg = json.loads((other / "tokenizer_config.json").read_text())
        (other / "tokenizer_config.json").write_text(json.dumps({**cfg, **change}))
        assert load_rust_tokenizer(str(other)) is None, change
    assert load_rust_tokenizer("smollm2") is None and load_rust_tokenizer(str(tmp_path / "missing")) is None
