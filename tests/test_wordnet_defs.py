"""wordnet_defs (cptkit/eval/build_tasks.py): built from a small WordNet database written here in
WordNet 3.0's own file format (index.POS / data.POS) and a dictd-style GCIDE text, no network."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from cptkit.core.errors import BadInput
from cptkit.eval import build_tasks as B
from cptkit.eval import fewshot, task_data, tasks

LICENCE = "  1 This software and database is being provided to you, the LICENSEE, by  \n"
NOUNS = {  # offset: (words, gloss)
    100: (["bank"], "sloping land (especially the slope beside a body of water); \"they pulled the canoe up on the bank\""),
    200: (["depository", "bank"], "a financial institution that accepts money and channels it into loans"),
    300: (["Paris"], "the capital and largest city of France and its cultural centre"),
    400: (["lantern"], "light in a transparent protective case"),
    500: (["kettle"], "a metal pot for stewing or boiling; usually has a lid"),
    600: (["hammer"], "a hand tool with a heavy rigid head and a handle, used to deliver an impulsive force"),
    700: (["chisel"], "an edge tool with a flat steel blade with a cutting edge"),
    800: (["meadow"], "a field where grass or alfalfa are grown to be made into hay"),
    900: (["mitochondrion"], "(biology) an organelle containing enzymes responsible for producing energy"),
    1000: (["puddle"], "a puddle is a small body of standing water"),  # names itself: unusable
    1100: (["harbour"], "a sheltered port where ships can take on or discharge cargo"),
}
INDEX = {"bank": [100, 200], "depository": [200], "paris": [300], "lantern": [400], "kettle": [500],
         "hammer": [600], "chisel": [700], "meadow": [800], "mitochondrion": [900], "puddle": [1000],
         "harbour": [1100]}
OTHER = {"verb": {10: (["wander"], "move about aimlessly or without any destination")},
         "adj": {20: (["galore"], "in great numbers; \"there were daffodils galore\"")},
         "adv": {30: (["swiftly"], "in a swift manner, without delay at all")}}


def _write_pos(wn: Path, suffix: str, synsets: dict[int, tuple[list[str], str]], index: dict[str, list[int]]) -> None:
    ss = {"noun": "n", "verb": "v", "adj": "s", "adv": "r"}[suffix]
    data = [LICENCE]
    for off, (words, gloss) in synsets.items():
        ws = " ".join(f"{w}{'(ip)' if suffix == 'adj' else ''} 0" for w in words)
        data.append(f"{off:08d} 05 {ss} {len(words):02x} {ws} 000 | {gloss}  \n")
    (wn / f"data.{suffix}").write_text("".join(data))
    lines = [LICENCE] + [f"{lemma} {ss} {len(offs)} 1 @ {len(offs)} 0 {' '.join(f'{o:08d}' for o in offs)}  \n"
                         for lemma, offs in sorted(index.items())]
    (wn / f"index.{suffix}").write_text("".join(lines))


@pytest.fixture
def wordnet(tmp_path: Path) -> tuple[Path, Path]:
    wn = tmp_path / "wordnet"
    wn.mkdir()
    _write_pos(wn, "noun", NOUNS, INDEX)
    for suffix, synsets in OTHER.items():
        _write_pos(wn, suffix, synsets, {w[0].split("(")[0]: [off] for off, (w, _) in synsets.items()})
    gcide = tmp_path / "gcide.dict.dz"  # a dictd .dz is gzip-readable
    gcide.write_bytes(gzip.compress(
        b"Kettle \\Ket\"tle\\, n. [WordNet 1.5] A metal pot for stewing or boiling.\n\n"  # the whole gloss
        b"Hammer \\Ham\"mer\\, n. A hand tool with a heavy rigid head and a handle, used to pound.\n"))  # 8 words
    return wn, gcide


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_entries_use_the_first_sense_and_skip_unusable_words(wordnet):
    entries = {e[0]: e for e in B.iter_wordnet(wordnet[0])}
    # not Paris (a proper noun), puddle and swiftly (their glosses name them); galore(ip) is galore
    assert sorted(entries) == ["bank", "chisel", "depository", "galore", "hammer", "harbour", "kettle",
                               "lantern", "meadow", "mitochondrion", "wander"]
    assert entries["bank"][1:4] == ("noun", "Sloping land (especially the slope beside a body of water)",
                                    frozenset({100, 200}))
    assert entries["mitochondrion"][2] == "An organelle containing enzymes responsible for producing energy"
    assert entries["kettle"][2] == "A metal pot for stewing or boiling"


def test_build_excludes_gcide_glosses_never_offers_another_sense_and_is_deterministic(wordnet, tmp_path):
    wn, gcide = wordnet
    # the 7 nouns that can be asked about, all drawn; verb/adjective pools are too small for 3 wrong
    # choices; kettle (its gloss word for word) and hammer (an 8-gram of its gloss) are in GCIDE
    info = B.build_wordnet_defs(tmp_path / "a", n_test=5, n_fewshot=2, seed=3, wordnet=wn, gcide_data=gcide)
    assert info["splits"] == {"test": 5, "validation": 2} and info["candidates"] == 11
    assert info["candidates_sharing_an_8gram_with_gcide"] == 1
    rows = _rows(tmp_path / "a/wordnet_defs/test.jsonl") + _rows(tmp_path / "a/wordnet_defs/validation.jsonl")
    assert [r["id"] for r in rows] == [f"wordnet-{k:04d}" for k in range(7)]
    assert {r["word"] for r in rows} == {"bank", "chisel", "depository", "harbour", "lantern", "meadow",
                                         "mitochondrion"}
    assert all(r["pos"] == "noun" and len(set(r["choices"])) == 4 and 0 <= r["label"] < 4 for r in rows)
    with pytest.raises(B.CptkitError, match="only 7 usable WordNet entries, fewer than 8"):
        B.build_wordnet_defs(tmp_path / "c", n_test=6, n_fewshot=2, wordnet=wn, gcide_data=gcide)
    B.build_wordnet_defs(tmp_path / "b", n_test=5, n_fewshot=2, seed=3, wordnet=wn, gcide_data=gcide)
    for split in ("test", "validation"):
        a, b = (tmp_path / d / f"wordnet_defs/{split}.jsonl" for d in ("a", "b"))
        assert a.read_bytes() == b.read_bytes()
    entries = sorted(B.iter_wordnet(wn))
    in_gcide = ("A metal pot", "A hand tool")
    again = B.wordnet_rows(entries, 7, 3, lambda d: d.startswith(in_gcide))
    assert again[0] == rows and again[1] == info["skipped_in_gcide"]
    for seed in range(12):  # bank (two senses) never gets the gloss of its other sense as a wrong choice
        asked: list[str] = []
        drawn, skipped = B.wordnet_rows(entries, 8, seed, lambda d, asked=asked: asked.append(d) or d.startswith("A metal pot"))
        bank = next(r for r in drawn if r["word"] == "bank")
        assert not any(c.startswith("A financial institution") for c in bank["choices"])
        assert skipped == asked.count("A metal pot for stewing or boiling") <= 1


def test_task_file_renders_the_prompt(wordnet, tmp_path):
    wn, gcide = wordnet
    B.build_wordnet_defs(tmp_path, n_test=4, n_fewshot=2, seed=1, wordnet=wn, gcide_data=gcide)
    task = tasks.load_task("wordnet_defs", Path(__file__).parent.parent / "conf/eval/tasks", tmp_path)
    doc = task_data.load_docs(task, "test")[0]
    assert fewshot.contexts(task, [doc], 0, seed=1)[0] == f"Word: {doc['word']} (noun)\nDefinition:"


def test_bad_wordnet_line_names_file_and_line(wordnet):
    wn, _ = wordnet
    (wn / "data.verb").write_text(LICENCE + "00000010 05 v zz wander 0 | broken\n")
    with pytest.raises(BadInput, match=r"data\.verb:2: not a WordNet data line"):
        list(B.iter_wordnet(wn))
