"""synthesize-qa: parsing and rejection rules, discipline selection on real documents, code mode."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from outputs import read_manifest, records

from cptkit.core.config import compose_step
from cptkit.core.errors import CptkitError
from cptkit.llm.prompts import max_new_tokens
from cptkit.steps.synthesize_qa import judge_qa, length_band, run
from cptkit.synthetic.qa import (
    count_words,
    discipline_of,
    parse_problem_solution,
    snippet,
    url_host,
)
from tests._tiny_llm import QUESTIONS, cached_tiny_model

# Llama-3-SynE App. A, "Good Case 1" (abridged to its first two paragraphs)
GOOD_CASE = """[Problem] Given a system of oppositely charged layers, such as a double layer of ions in an electrolyte solution, explain why these layers do not combine (neutralize) with each other.

[Solution] In a system of oppositely charged layers, such as a double layer of ions in an electrolyte solution, the layers do not combine (neutralize) due to the electrostatic repulsion between the ions. This repulsion arises from the Coulombic force, which is a fundamental force in nature that acts between charged particles.

To understand this, let's consider a simple example of a positively charged cation (e.g., Na+) and a negatively charged anion (e.g., Cl-). When these ions are brought close together, they experience an electrostatic force that pushes them apart. This force can be calculated using Coulomb's law, $F = k * (q1 * q2)/r^2$, where k is the Coulomb constant (approximately $8.99 \\times 10^9 Nm^2 C^{-2}$)."""


def test_parse_problem_solution_paper_case_and_variants():
    problem, solution = parse_problem_solution(GOOD_CASE)
    assert problem.startswith("Given a system of oppositely charged layers") and problem.endswith("with each other.")
    assert solution.startswith("In a system") and "$F = k * (q1 * q2)/r^2$" in solution
    assert count_words(solution) == 121 and len(solution.split()) == 116  # "(e.g.," "Na+)" ... split further
    assert parse_problem_solution("Here you go.\n**[Problem]**: What is 2+2?\n**[Solution]**: It is 4.") \
        == ("What is 2+2?", "It is 4.")
    assert parse_problem_solution("## [Problem]\nA?\n## [Solution]\nB.") == ("A?", "B.")
    assert parse_problem_solution("What is 2+2?\n[Solution] 4.") == ("What is 2+2?", "4.")
    assert parse_problem_solution("[Problem] What is 2+2? The answer is 4.") is None  # no solution
    assert parse_problem_solution("[Problem]\n[Solution] 4.") is None  # empty problem
    assert parse_problem_solution("[Problem] A? [Solution]   ") is None  # empty solution


def test_judge_qa_reasons():
    assert judge_qa(GOOD_CASE, "stop", 8, 100, 150)[0] is None
    assert judge_qa(GOOD_CASE, "length", 8, 100, 150)[0] == "truncated"
    assert judge_qa(GOOD_CASE, "stop", 8, 250, 350)[0] == "too_short"  # 124 words < 250
    assert judge_qa(GOOD_CASE, "stop", 8, 50, 100)[0] == "too_long"
    assert judge_qa(GOOD_CASE, "stop", 8, 50, 0)[0] is None  # no upper bound
    assert judge_qa("[Problem] Why? [Solution] " + "word " * 300, "stop", 8, 250, 350)[0] == "short_problem"
    assert judge_qa("no markers at all", "stop", 8, 1, 0)[0] == "malformed"


def _paper_solution() -> str:
    """The whole [Solution] of Llama-3-SynE App. A "Good Case 1" (five paragraphs), from the paper's text."""
    import glob

    paper = Path(glob.glob("/work/shared/seeds/000_*.txt")[0]) if glob.glob("/work/shared/seeds/000_*.txt") else None
    if paper is None:
        pytest.skip("the Llama-3-SynE paper text is not on this machine")
    text = paper.read_text()
    start = text.index("[Solution] In a system of oppositely charged layers")
    return text[start:text.index("Good Case 2", start)].strip()


def test_length_band_keeps_the_papers_own_example():
    """§4.2.1 asks for "around 250-350 words": a band around that, not a hard filter (issue 11)."""
    assert length_band(250, 350, 0.5) == (125, 525)  # 250·0.5, 350·1.5
    assert length_band(250, 350, 0.0) == (250, 350)
    assert length_band(250, 350, 0.1) == (225, 385)
    assert length_band(250, 0, 0.5) == (125, 0)  # no upper bound stays none
    with pytest.raises(CptkitError, match="length_tolerance"):
        length_band(250, 350, -0.1)
    qa = "[Problem] Given a system of oppositely charged layers, such as a double layer of ions in an " \
         "electrolyte solution, explain why these layers do not combine (neutralize) with each other.\n\n" \
         + _paper_solution()
    n = count_words(parse_problem_solution(qa)[1])
    assert 350 < n < 385  # the paper's example is longer than the range it asked for (357 words by wc)
    assert judge_qa(qa, "stop", 8, 250, 350)[0] == "too_long"  # the old hard filter rejected it
    assert judge_qa(qa, "stop", 8, *length_band(250, 350, 0.5))[0] is None  # the default band keeps it
    assert judge_qa(qa, "stop", 8, *length_band(250, 350, 0.1))[0] is None
    cfg = compose_step("synthesize-qa", ["io.inputs=[x]", "io.output=y"]).synth
    assert length_band(cfg.min_solution_words, cfg.max_solution_words, cfg.length_tolerance) == (125, 525)


def test_llm_max_new_tokens_wins_over_the_prompt_file():
    """Issue 16: llm.max_new_tokens on the command line wins; unset, each prompt file's own value."""
    cfg = compose_step("synthesize-qa", ["io.inputs=[x]", "io.output=y"])
    assert cfg.llm.max_new_tokens is None
    assert [max_new_tokens(cfg.synth[p], cfg.llm) for p in ("prompt", "problem_prompt", "solution_prompt")] \
        == [768, 320, 512]
    cfg = compose_step("synthesize-qa", ["io.inputs=[x]", "io.output=y", "llm.max_new_tokens=64"])
    assert [max_new_tokens(cfg.synth[p], cfg.llm) for p in ("prompt", "problem_prompt", "solution_prompt")] == [64] * 3


def test_discipline_by_url_domain():
    cfg = compose_step("synthesize-qa", ["io.inputs=[x]", "io.output=y"]).synth
    domains = {k: list(v) for k, v in cfg.domains.items()}
    assert len(domains) == 9
    assert discipline_of("https://math.stackexchange.com/questions/1", domains) == "mathematics"
    assert discipline_of("https://www.physicsforums.com/threads/x", domains) == "physics"
    assert discipline_of("https://ncbi.nlm.nih.gov/pmc/1", domains) == "biology"  # longest match wins
    assert discipline_of("https://www.nih.gov/health", domains) == "medical_science"
    assert discipline_of("https://english.stackexchange.com/q/1", domains) == "general_education"
    assert discipline_of("https://example.com/", domains) is None and discipline_of(None, domains) is None
    assert url_host("HTTPS://WWW.Space.com/x") == "space.com" and url_host("gcide://Abacus") == "abacus"


def test_snippet_lengths():
    text = "One two three four.\n\nFive six seven eight nine. Ten eleven.\n\nTwelve."
    assert snippet(text, 4) == "One two three four."
    assert snippet(text, 11) == "One two three four.\n\nFive six seven eight nine. Ten eleven."
    assert snippet(text, 3) == "One two three"  # first paragraph cut hard: no sentence end in budget
    assert snippet("Alpha beta. Gamma delta epsilon.", 4) == "Alpha beta."
    import random

    a, b = snippet(text, 50, random.Random(1)), snippet(text, 50, random.Random(1))
    assert a == b and text.endswith(a)


# -- the step on a tiny model -------------------------------------------------------------------
def _tiny(*extra: str) -> list[str]:
    return [f"llm.model={cached_tiny_model()}", "llm.device=cpu", "llm.num_threads=1", "llm.cache=false", "llm.temperature=0.5",
            "llm.top_p=1.0", "quiet=true", "synth.prompt.template='Make a {discipline} problem: {snippet}'",
            "synth.prompt.max_new_tokens=120", "synth.snippet.max_words=12", "synth.snippet.min_words=5",
            "synth.min_problem_words=2", "synth.min_solution_words=3", "synth.max_solution_words=200",
            "synth.length_tolerance=0", "synth.trim_truncated=true", *extra]


@pytest.fixture(scope="module")
def seed_docs(corpus_records, tmp_path_factory) -> Path:
    """Real documents: 6 Python docs, 6 Maxima docs, 4 GCIDE entries (no listed domain), and two
    records with an explicit discipline (one known, one not), in two shards."""
    py = [r for r in corpus_records if r["url"].startswith("https://docs.python.org/")][:6]
    mx = [r for r in corpus_records if r["url"].startswith("https://maxima.sourceforge.io/")][:6]
    gc = [r for r in corpus_records if r["url"].startswith("gcide://")][:4]
    extra = [{"id": "x-phys", "text": py[0]["text"], "discipline": "Physics"},
             {"id": "x-astro", "text": py[0]["text"], "discipline": "astrology"}]
    d = tmp_path_factory.mktemp("seeddocs")
    for name, recs in (("a.jsonl", py + gc), ("b.jsonl", mx + extra)):
        (d / name).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    return d


def test_scientific_selection_generation_and_rejections(seed_docs, tmp_path):
    from cptkit.synthetic.qa import count_words as cw

    docs = [json.loads(line) for f in sorted(seed_docs.glob("*.jsonl")) for line in f.open()]
    long_enough = {r["id"] for r in docs if cw(r["text"]) >= 5}
    expect = {"computer_science": [r for r in docs if "docs.python.org" in r.get("url", "") and r["id"] in long_enough],
              "mathematics": [r for r in docs if "maxima.sourceforge.io" in r.get("url", "") and r["id"] in long_enough],
              "physics": [r for r in docs if r.get("discipline") == "Physics"]}
    out = tmp_path / "qa"
    res = run(compose_step("synthesize-qa", [f"io.inputs=[{seed_docs}]", f"io.output={out}", *_tiny()]))
    n_prompts = sum(len(v) for v in expect.values())
    assert res["prompts"] == n_prompts == res["seeds_used"]
    assert res["skipped"]["no_discipline"] == 4 and res["skipped"]["unknown_discipline"] == 1
    assert res["kept"] + sum(res["rejected"].values()) == n_prompts
    assert res["kept"] > 0 and set(res["rejected"]) <= {"truncated", "malformed", "short_problem", "too_short", "too_long"}
    recs = records(out)
    assert len(recs) == res["kept"] == sum(res["per_discipline"].values())
    ids = {d: {r["id"] for r in v} for d, v in expect.items()}
    for r in recs:
        assert r["text"] == f"{r['problem']}\n\n{r['solution']}"
        assert r["seed_id"] in ids[r["discipline"]] and r["id"].startswith(r["seed_id"] + ".qa")
        assert 3 <= count_words(r["solution"]) <= 200 and count_words(r["problem"]) >= 2
        assert r["model"] == str(cached_tiny_model()) and r["gen"]["max_new_tokens"] == 120
        assert count_words(r["snippet"]) <= 12
    assert read_manifest(out)["extra"]["QA pairs kept"] == res["kept"]
    # only one discipline, two samples per snippet
    out2 = tmp_path / "qa2"
    res2 = run(compose_step("synthesize-qa", [f"io.inputs=[{seed_docs}]", f"io.output={out2}", *_tiny(),
                                              "synth.disciplines=[mathematics]", "synth.samples_per_snippet=2"]))
    assert res2["prompts"] == 2 * len(expect["mathematics"])
    assert res2["skipped"]["other_discipline"] == len(expect["computer_science"]) + 1
    assert {r["discipline"] for r in records(out2)} <= {"mathematics"}


def test_generator_provenance_and_norecords(seed_docs, tmp_path, caplog, capfd):
    """Every record names its generator; 0 kept warns with the reasons, or fails with synth.min_records."""
    out = tmp_path / "qa"
    res = run(compose_step("synthesize-qa", [f"io.inputs=[{seed_docs}]", f"io.output={out}", *_tiny(),
                                             "synth.prompt.max_new_tokens=4", "llm.max_new_tokens=120"]))
    recs = records(out)
    assert recs and len(recs) == res["kept"]
    for r in recs:
        # the same fields as expand-queries' records (Generator.provenance), the backend included
        assert r["meta"]["generator"] == {"prompt": "scientific_qa", "model": str(cached_tiny_model()), "backend": "transformers",
                                          "temperature": 0.5, "top_p": 1.0, "max_new_tokens": 120, "seed": 0}
    manifest = read_manifest(out)["extra"]
    assert manifest["acceptance rate"] == round(res["kept"] / res["prompts"], 4)
    # nothing can pass a 10,000-word minimum: exit 0 with a warning naming the reason ...
    import logging

    with caplog.at_level(logging.WARNING):
        res = run(compose_step("synthesize-qa", [f"io.inputs=[{seed_docs}]", f"io.output={tmp_path / 'none'}", *_tiny(),
                                                 "synth.disciplines=[mathematics]", "synth.min_solution_words=10000"]))
    assert res["kept"] == 0 and sum(res["rejected"].values()) == res["prompts"] > 0
    said = " ".join((caplog.text + capfd.readouterr().err).split())  # the log, wherever it went
    assert f"kept 0 QA pairs of {res['prompts']} prompts: " in said
    assert all(f"{k} {v}" in said for k, v in res["rejected"].items())
    # ... or exit 2 with synth.min_records
    from typer.testing import CliRunner

    from cptkit.cli import app

    r = CliRunner().invoke(app, ["synthesize-qa", "--in", str(seed_docs), "--out", str(tmp_path / "fail"), *_tiny(),
                                 "synth.disciplines=[mathematics]", "synth.min_solution_words=10000",
                                 "synth.min_records=1"])
    assert isinstance(r.exception, CptkitError)  # the CLI's entry point maps it to one line and exit 2
    assert "kept 0 QA pairs, fewer than synth.min_records=1 (" in str(r.exception)
    assert not (tmp_path / "fail" / "_SUCCESS").exists()


def test_scientific_config_errors(seed_docs, tmp_path):
    with pytest.raises(CptkitError, match=r"synth.disciplines=\['alchemy'\]: 'alchemy' has no domain list"):
        run(compose_step("synthesize-qa", [f"io.inputs=[{seed_docs}]", f"io.output={tmp_path / 'a'}", *_tiny(),
                                           "synth.disciplines=[alchemy]"]))
    with pytest.raises(CptkitError, match=r"lacks placeholder\(s\) \{snippet\}"):
        run(compose_step("synthesize-qa", [f"io.inputs=[{seed_docs}]", f"io.output={tmp_path / 'b'}", *_tiny(),
                                           "synth.prompt.template='Write about {discipline}'"]))


PROBLEMS = QUESTIONS  # the tiny model's own domain: a seed "problem set" of eight questions


def test_code_mode_in_context_expansion(tmp_path):
    seeds = tmp_path / "leet.jsonl"
    seeds.write_text("".join(json.dumps({"id": f"lc{i}", "text": p, "problem": p}) + "\n" for i, p in enumerate(PROBLEMS)))
    args = [f"io.inputs=[{seeds}]", "synth.mode=code", "synth.code.num_problems=8", "synth.code.demos=2",
            "synth.problem_prompt.template='Like these: {demos} Write a new {discipline} problem.'",
            "synth.solution_prompt.template='Solve: {problem}'", "synth.problem_prompt.max_new_tokens=48",
            "synth.solution_prompt.max_new_tokens=64", "synth.code.min_problem_words=3",
            "synth.code.min_solution_words=3", *_tiny()]
    out = tmp_path / "code"
    res = run(compose_step("synthesize-qa", [f"io.output={out}", *args]))
    assert res["prompts"] == 8 and res["seeds_used"] == len(PROBLEMS) == 8
    assert res["kept"] + sum(res["rejected"].values()) == 8
    recs = records(out)
    assert len(recs) == res["kept"] > 0
    for r in recs:
        assert len(r["demo_ids"]) == 2 and len(set(r["demo_ids"])) == 2 and r["seed_id"] == r["demo_ids"][0]
        assert r["discipline"] == "programming" and r["text"] == f"{r['problem']}\n\n{r['solution']}"
        assert r["problem"] not in PROBLEMS
    out2 = tmp_path / "code2"
    run(compose_step("synthesize-qa", [f"io.output={out2}", *args]))
    assert records(out2) == recs  # deterministic: same demonstrations, same samples


def test_champ_problems_seed_set(tmp_path):
    """The CHAMP competition-math problems (PyPI champ-dataset) convert into a seed problem set."""
    pytest.importorskip("champ_dataset")
    import runpy

    mod = runpy.run_path(str(Path(__file__).resolve().parent.parent / "examples" / "champ_problems.py"))
    recs = mod["champ_records"]()
    assert len(recs) == 270 and len({r["id"] for r in recs}) == 270
    first = next(r for r in recs if r["id"] == "P_Combinatorics_1")
    assert first["problem"].startswith("Let a string consist of digit 1, 2, 3.") and first["solution"]


@pytest.mark.slow
def test_scientific_with_embedded_smollm2(seed_docs, tmp_path, smollm2):
    """The paper's prompt with the real embedded model on two snippets (short outputs)."""
    out = tmp_path / "qa"
    res = run(compose_step("synthesize-qa", [f"io.inputs=[{seed_docs}/b.jsonl]", f"io.output={out}", "quiet=true",
                                             "llm.cache=false", "llm.device=cpu", "synth.disciplines=[physics]",
                                             "synth.prompt.max_new_tokens=160", "synth.snippet.max_words=60",
                                             "synth.min_solution_words=20", "synth.max_solution_words=0"]))
    assert res["prompts"] == 1 and res["kept"] + sum(res["rejected"].values()) == 1
    assert res["llm"]["requests"] == 1 and res["llm"]["completion_tokens"] > 0


@pytest.mark.slow
def test_demo_qa_settings_keeprecords(tmp_path, smollm2):
    """The Makefile's SYNTH_ARGS (CHAMP seeds, code mode, SmolLM2) keep at least one record, with provenance."""
    import re
    import runpy
    import shlex

    pytest.importorskip("champ_dataset")
    root = Path(__file__).resolve().parent.parent
    mk = (root / "Makefile").read_text()
    synth = re.search(r"^SYNTH_ARGS\s*\?=\s*((?:.*\\\n)*.*)$", mk, re.M).group(1).replace("\\\n", " ")
    args = [a for a in shlex.split(synth) if not a.startswith("synth.code.num_problems=")]
    recs = runpy.run_path(str(root / "examples" / "champ_problems.py"))["champ_records"]()
    (tmp_path / "champ.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    res = run(compose_step("synthesize-qa", [f"io.inputs=[{tmp_path / 'champ.jsonl'}]", f"io.output={tmp_path / 'qa'}",
                                             *args, "synth.code.num_problems=2", "llm.cache=false", "llm.device=cpu",
                                             "quiet=true"]))
    assert res["prompts"] == 2 and res["kept"] >= 1, res
    for r in records(tmp_path / "qa"):
        assert r["meta"]["generator"]["prompt"] == "code_solution" and r["meta"]["generator"]["max_new_tokens"] == 128
