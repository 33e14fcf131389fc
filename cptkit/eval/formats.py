"""Readers for benchmarks' own published file formats (offline), each giving a list of dicts.

A task YAML names the reader with ``data_format`` (one name, or ``{split: name}``) and passes
``format_options``. Every reader yields the field layout of the dataset's Hugging Face hub copy
where one exists, so one prompt template serves both the local files and ``hub``:

=================  ==================================================================  =========================
reader             published layout (path given in ``data_files``)                      fields yielded
=================  ==================================================================  =========================
``jsonl``          one JSON object a line (``.jsonl``/``.jsonl.gz``)                     as in the file
``json``           a JSON list (SciQ, SVAMP, MAWPS, Jeopardy) or ``{"examples"|"data": [...]}`` as in the file
``math_tree``      MATH tarball: ``MATH/<split>/<subject>/<n>.json``, seven subjects    problem level type solution subject id
``mmlu_csv``       Hendrycks tarball: ``data/<split>/<subject>_<split>.csv``, no header  question subject choices answer(int)
``ceval_csv``      C-Eval zip: ``<split>/<subject>_<split>.csv`` (header id,question,A-D) id question A B C D answer explanation subject
``cmmlu_csv``      CMMLU zip: ``<split>/<subject>.csv`` (header ,Question,A,B,C,D,Answer) Question A B C D Answer subject
``agieval_jsonl``  AGIEval ``data/v1/<task>.jsonl`` (passage question options label)    passage question choices label(int) subtask
``bbh_json``       BIG-Bench-Hard ``bbh/<task>.json`` ``{"examples": [{input,target}]}``  input target subtask description
``bbh_cot``        BIG-Bench-Hard ``cot-prompts/<task>.txt`` (the 3 CoT exemplars)       input target subtask description
``mathqa_json``    MathQA ``<split>.json`` list (Problem Rationale options correct)      Problem Rationale choices label(int)
``asdiv_xml``      ASDiv ``ASDiv.xml`` (``<Problem><Body><Question><Answer>``)           id body question answer formula
``arc_jsonl``      ARC-V1-Feb2018 ``*.jsonl`` (question.stem, question.choices); the same  id question choices{text,label} answerKey
                   layout: OpenBookQA ``Data/Main/*.jsonl``, CommonsenseQA ``*_rand_split.jsonl``
``jsonl_labels``   ``<name>.jsonl`` + ``<name>-labels.lst`` (PIQA, SIQA)                   as in the file, label(int)
``bigbench_json``  BIG-bench ``benchmark_tasks/<task>/`` task.json (+ ``<subtask>/task.json``) input targets multiple_choice_targets
                                                                                        multiple_choice_scores label(int|None)
                                                                                        task_prefix input_prefix output_prefix subtask id
``wsc_xml``        Winograd ``WSCollection.xml`` (``<schema>``: txt1 pron txt2, answers)  text pronoun pronoun_loc options label(int)
                                                                                        partial_options source id
``squad_json``     SQuAD v1.1 ``{train,dev}-v1.1.json`` (data/paragraphs/qas)          id title context question answers{text,answer_start}
``coqa_json``      CoQA ``coqa-{train,dev}-v1.0.json``, one item per question turn      id story history[{question,answer}] question answer
                                                                                        answers turn_id source
``triviaqa_json``  TriviaQA ``qa/<source>-<split>.json`` (``{"Data": [...]}``)           question_id question answer{value,aliases,
                                                                                        normalized_value,normalized_aliases}
``mbpp_jsonl``     ``mbpp.jsonl``; the split is the task_id range of the paper           task_id text code test_list test_setup_code
``scieval_json``   SciEval ``scieval-*.json`` list, ``type == multiple-choice`` items    id question choices label(int) category
``cmdgen``         CmdGen JSONL or JSON list of question/command pairs (field names below) id question command
=================  ==================================================================  =========================

``format_options.sample: N`` (any reader) keeps a fixed random subset of N items in file order
(``sample_seed``, default 1234): the Gauntlet's subsampled TriviaQA and Jeopardy.

CmdGen's field names are not stated by Velocitune (App. A labels them "Question" and "Target
Command"); ``cmdgen`` takes the question from the first of ``CMDGEN_QUESTION`` and the command
from the first of ``CMDGEN_COMMAND`` present in each item, so ``{"question", "command"}`` (ours),
App. A's labels and an instruction/output layout all read the same.
"""

from __future__ import annotations

import csv
import gzip
import json
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cptkit.core.errors import BadInput, CptkitError
from cptkit.core.records import read_jsonl

MATH_SUBJECTS = ("algebra", "counting_and_probability", "geometry", "intermediate_algebra", "number_theory",
                 "prealgebra", "precalculus")
# Austin et al. 2021 §2.1: task ids 1-10 prompt, 11-510 test, 511-600 validation, 601-974 train
# ("fewshot": ids 2-4, the three prompt examples of the paper's Figure 1 and of lm-eval's mbpp)
MBPP_SPLITS = {"prompt": (1, 10), "fewshot": (2, 4), "test": (11, 510), "validation": (511, 600), "train": (601, 974)}
LETTERS = "ABCDEFGHIJ"


class MissingData(CptkitError):
    """A benchmark's files are not where the task YAML says."""


def _open_text(p: Path):
    return gzip.open(p, "rt", encoding="utf-8") if p.suffix == ".gz" else open(p, encoding="utf-8")


def load_json(path: Path) -> Any:
    """The JSON value in ``path`` (``.gz`` too); malformed JSON is a ``BadInput`` naming the line."""
    with _open_text(path) as fh:
        try:
            return json.load(fh)
        except json.JSONDecodeError as e:
            raise BadInput(str(path), e.lineno, f"malformed JSON: {e.msg}") from None


def read_json(path: Path) -> list[dict]:
    """A JSON list of objects, ``{"examples"|"data": [...]}``, or ``{id: object}``."""
    obj = load_json(path)
    if isinstance(obj, dict):
        for k in ("examples", "data"):
            if isinstance(obj.get(k), list):
                obj = obj[k]
                break
        else:
            obj = [v | {"id": k} if isinstance(v, dict) else v for k, v in obj.items()]
    if not isinstance(obj, list) or not all(isinstance(x, dict) for x in obj):
        raise BadInput(str(path), None, "expected a JSON list of objects")
    return obj


def _need(p: Path, what: str) -> Path:
    if not p.exists():
        raise MissingData(f"{what}: {p} not found")
    return p


def _names(opts: dict, key: str, found: list[str], where: Path) -> list[str]:
    """``opts[key]`` (checked against ``found``) or every name found."""
    want = opts.get(key)
    if not want:
        if not found:
            raise MissingData(f"no files in {where}")
        return found
    missing = [w for w in want if w not in found]
    if missing:
        raise MissingData(f"{where}: missing {', '.join(missing)}")
    return list(want)


def math_tree(path: Path, split: str, opts: dict) -> list[dict]:
    """MATH (Hendrycks et al. 2021) as published: one JSON file per problem, seven subject folders."""
    _need(path, "MATH split folder")
    subjects = list(opts.get("subjects") or MATH_SUBJECTS)
    docs = []
    for s in subjects:
        d = path / s
        files = sorted(d.glob("*.json"), key=lambda f: (len(f.stem), f.stem)) if d.is_dir() else []
        if not files:
            raise MissingData(f"MATH subject {s}: no {d}/*.json (all seven subjects are needed)")
        for f in files:
            (doc,) = read_json_one(f)
            docs.append({**doc, "subject": s, "id": f"{s}/{f.stem}"})
    return docs


def read_json_one(f: Path) -> list[dict]:
    try:
        obj = json.loads(f.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BadInput(str(f), e.lineno, f"malformed JSON: {e.msg}") from None
    if not isinstance(obj, dict):
        raise BadInput(str(f), None, "expected a JSON object")
    return [obj]


def _csv_rows(f: Path, header: bool) -> list[list[str]] | list[dict]:
    with open(f, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh)) if header else list(csv.reader(fh))


def subject_csvs(path: Path, opts: dict, what: str, suffix: str, header: bool, ok: Callable[[Any], bool],
                 why: str, doc: Callable[[Any, str], dict]) -> list[dict]:
    """The rows of one CSV per subject, ``<subject><suffix>`` in the folder ``path`` (``subjects``
    option: which ones, else all): MMLU, C-Eval and CMMLU differ only in the file names, the header,
    the check of a row (``ok``, else ``why`` names its line) and the document a row becomes (``doc``)."""
    _need(path, what)
    found = sorted(f.name[: -len(suffix)] for f in path.glob(f"*{suffix}"))
    docs = []
    for s in _names(opts, "subjects", found, path):
        f = path / f"{s}{suffix}"
        for n, row in enumerate(_csv_rows(f, header=header), 2 if header else 1):
            if not ok(row):
                raise BadInput(str(f), n, why)
            docs.append(doc(row, s))
    return docs


def _has(*columns: str) -> Callable[[dict], bool]:
    """A row check: every one of ``columns`` is present and not empty."""
    return lambda row: all(row.get(k) not in (None, "") for k in columns)


def mmlu_csv(path: Path, split: str, opts: dict) -> list[dict]:
    """MMLU's ``data/<split>/<subject>_<split>.csv``: question, A, B, C, D, answer letter (no header)."""
    return subject_csvs(path, opts, "MMLU split folder", f"_{split}.csv", header=False,
                        ok=lambda r: len(r) == 6 and r[5].strip() in "ABCD" and bool(r[5].strip()),
                        why="expected question,A,B,C,D,answer-letter",
                        doc=lambda r, s: {"question": r[0], "subject": s, "choices": r[1:5],
                                          "answer": "ABCD".index(r[5].strip())})


def ceval_csv(path: Path, split: str, opts: dict) -> list[dict]:
    """C-Eval's ``<split>/<subject>_<split>.csv`` (header id,question,A,B,C,D,answer[,explanation])."""
    return subject_csvs(path, opts, "C-Eval split folder", f"_{split}.csv", header=True,
                        ok=_has("question", "A", "B", "C", "D", "answer"),
                        why="expected columns id,question,A,B,C,D,answer",
                        doc=lambda r, s: {**r, "subject": s, "explanation": r.get("explanation") or ""})


def cmmlu_csv(path: Path, split: str, opts: dict) -> list[dict]:
    """CMMLU's ``<split>/<subject>.csv`` (header ``,Question,A,B,C,D,Answer``)."""
    return subject_csvs(path, opts, "CMMLU split folder", ".csv", header=True,
                        ok=_has("Question", "A", "B", "C", "D", "Answer"),
                        why="expected columns Question,A,B,C,D,Answer",
                        doc=lambda r, s: {k: v for k, v in r.items() if k} | {"subject": s})


_OPT = re.compile(r"^\s*\(?([A-J])\)\s*")


def agieval_jsonl(path: Path, split: str, opts: dict) -> list[dict]:
    """AGIEval v1 ``<task>.jsonl`` (passage, question, options ``(A)...``, label letter) for each task."""
    _need(path, "AGIEval data folder")
    found = sorted(f.stem for f in path.glob("*.jsonl"))
    docs = []
    for t in _names(opts, "tasks", found, path):
        f = path / f"{t}.jsonl"
        for n, d in enumerate(read_jsonl(f), 1):
            options = d.get("options") or []
            label = d.get("label")
            if isinstance(label, list):
                label = label[0] if len(label) == 1 else None
            if not options or not isinstance(label, str) or label not in LETTERS[: len(options)]:
                raise BadInput(str(f), n, "expected options [(A)...] and one label letter")
            choices = [_OPT.sub("", o, count=1).strip() for o in options]
            docs.append({"passage": d.get("passage") or "", "question": d["question"], "choices": choices,
                         "label": LETTERS.index(label), "subtask": t, "id": f"{t}/{n - 1}"})
    return docs


def bbh_json(path: Path, split: str, opts: dict) -> list[dict]:
    """BIG-Bench-Hard ``bbh/<task>.json`` test examples, with each task's description from cot-prompts."""
    _need(path, "BIG-Bench-Hard folder")
    found = sorted(f.stem for f in (path / "bbh").glob("*.json"))
    docs = []
    for t in _names(opts, "tasks", found, path / "bbh"):
        desc = _bbh_prompt(path, t)[0]
        for i, d in enumerate(read_json(path / "bbh" / f"{t}.json")):
            docs.append({"input": d["input"], "target": str(d["target"]), "subtask": t, "description": desc,
                         "id": f"{t}/{i}"})
    return docs


def _bbh_prompt(path: Path, task: str) -> tuple[str, list[dict]]:
    f = _need(path / "cot-prompts" / f"{task}.txt", f"BBH chain-of-thought prompt of {task}")
    text = "\n".join(x for x in f.read_text(encoding="utf-8").splitlines() if x.strip() != "-----")
    head, *blocks = re.split(r"\n\s*\nQ: ", "\n\n" + text.strip() if text.lstrip().startswith("Q:") else text)
    shots = []
    for b in blocks:
        q, sep, a = b.partition("\nA: ")
        if not sep:
            raise BadInput(str(f), None, "a Q: block without A:")
        shots.append({"input": q.strip(), "target": a.strip(), "subtask": task})
    return head.strip(), shots


def bbh_cot(path: Path, split: str, opts: dict) -> list[dict]:
    """The three chain-of-thought exemplars of each BBH task (its few-shot split)."""
    found = sorted(f.stem for f in (path / "cot-prompts").glob("*.txt"))
    docs = []
    for t in _names(opts, "tasks", found, path / "cot-prompts"):
        desc, shots = _bbh_prompt(path, t)
        docs += [s | {"description": desc} for s in shots]
    return docs


_MATHQA_OPT = re.compile(r"[abcd] \) .*?, |e \) .*?$")


def mathqa_json(path: Path, split: str, opts: dict) -> list[dict]:
    """MathQA ``<split>.json``: options ``"a ) 38 , b ) 27.675 , ..."`` parsed as lm-eval's ``mathqa``."""
    docs = []
    for i, d in enumerate(read_json(_need(path, "MathQA file"))):
        choices = [c[4:].rstrip(" ,") for c in _MATHQA_OPT.findall(d.get("options", ""))]
        if len(choices) != 5 or d.get("correct") not in "abcde" or not d.get("correct"):
            raise BadInput(str(path), None, f"item {i}: expected options a)-e) and correct a-e")
        docs.append({**d, "choices": choices, "label": "abcde".index(d["correct"]), "id": str(i)})
    return docs


def asdiv_xml(path: Path, split: str, opts: dict) -> list[dict]:
    """ASDiv ``ASDiv.xml``: Body, Question, Answer ``"9 (apples)"`` (the number is kept), Formula."""
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(_need(path, "ASDiv XML")).getroot()
    except ET.ParseError as e:
        raise BadInput(str(path), e.position[0], f"malformed XML: {e}") from None
    docs = []
    for p in root.iter("Problem"):
        ans = (p.findtext("Answer") or "").strip()
        docs.append({"id": p.get("ID", str(len(docs))), "body": (p.findtext("Body") or "").strip(),
                     "question": (p.findtext("Question") or "").strip(), "answer": ans.split(" (")[0].strip(),
                     "answer_text": ans, "formula": (p.findtext("Formula") or "").strip(),
                     "solution_type": (p.findtext("Solution-Type") or "").strip(), "grade": p.get("Grade")})
    return docs


def arc_jsonl(path: Path, split: str, opts: dict) -> list[dict]:
    """ARC-V1-Feb2018 ``ARC-*-<Split>.jsonl`` converted to the hub layout (``allenai/ai2_arc``)."""
    docs = []
    for n, d in enumerate(read_jsonl(_need(path, "ARC file")), 1):
        q = d.get("question")
        if not isinstance(q, dict) or "stem" not in q or "answerKey" not in d:
            raise BadInput(str(path), n, "expected question.stem, question.choices, answerKey")
        ch = q.get("choices") or []
        docs.append({"id": d.get("id", str(n)), "question": q["stem"], "answerKey": d["answerKey"],
                     "choices": {"text": [c["text"] for c in ch], "label": [c["label"] for c in ch]}})
    return docs


def mbpp_jsonl(path: Path, split: str, opts: dict) -> list[dict]:
    """``mbpp.jsonl`` (974 problems): the split is the task_id range of Austin et al. 2021."""
    if split not in MBPP_SPLITS:
        raise CptkitError(f"MBPP split {split!r}: use one of {', '.join(MBPP_SPLITS)}")
    lo, hi = MBPP_SPLITS[split]
    docs = [d for d in read_jsonl(_need(path, "MBPP file")) if lo <= int(d["task_id"]) <= hi]
    return sorted(docs, key=lambda d: int(d["task_id"]))


_SCI_OPT = re.compile(r"^\s*([A-D])[.)．、]\s*(.*)$")


def scieval_json(path: Path, split: str, opts: dict) -> list[dict]:
    """SciEval ``scieval-*.json`` list: the multiple-choice items, options ``A. ...`` parsed off the question."""
    cats = set(opts.get("categories") or ())
    docs = []
    for i, d in enumerate(read_json(_need(path, "SciEval file"))):
        if d.get("type") != "multiple-choice" or (cats and d.get("category") not in cats):
            continue
        stem, choices = [], []
        for line in str(d["question"]).splitlines():
            m = _SCI_OPT.match(line)
            if m and LETTERS[len(choices)] == m.group(1):
                choices.append(m.group(2).strip())
            elif not choices:
                stem.append(line)
        ans = d.get("answer")
        ans = ans[0] if isinstance(ans, list) and ans else ans
        if len(choices) < 2 or not isinstance(ans, str) or ans.strip() not in LETTERS[: len(choices)]:
            raise BadInput(str(path), None, f"item {d.get('id', i)}: expected options A. .. and an answer letter")
        docs.append({"id": str(d.get("id", i)), "question": "\n".join(stem).strip(), "choices": choices,
                     "label": LETTERS.index(ans.strip()), "category": d.get("category", "")})
    return docs


CMDGEN_QUESTION = ("question", "Question", "instruction", "input", "prompt", "query")
CMDGEN_COMMAND = ("command", "Command", "target_command", "Target Command", "target", "cmd", "output", "answer")


def cmdgen(path: Path, split: str, opts: dict) -> list[dict]:
    """CmdGen question/command pairs: a JSONL file or a JSON list (``{"data": [...]}`` too)."""
    _need(path, "CmdGen file")
    with _open_text(path) as fh:
        try:
            obj = json.load(fh)
        except json.JSONDecodeError:  # several objects: JSONL (read_jsonl names a bad line)
            obj = None
    whole = isinstance(obj, list) or (isinstance(obj, dict) and any(isinstance(obj.get(k), list)
                                                                    for k in ("data", "examples")))
    rows = read_json(path) if whole else read_jsonl(path)
    docs = []
    for i, d in enumerate(rows):
        q = next((d[k] for k in CMDGEN_QUESTION if isinstance(d.get(k), str)), None)
        c = next((d[k] for k in CMDGEN_COMMAND if isinstance(d.get(k), str)), None)
        if q is None or c is None:
            raise BadInput(str(path), i + 1, f"item {i + 1}: expected a question ({' | '.join(CMDGEN_QUESTION)}) "
                           f"and a command ({' | '.join(CMDGEN_COMMAND)}), got fields {', '.join(d) or 'none'}")
        docs.append({"id": str(d.get("id", d.get("task_id", i))), "question": q.strip(), "command": c.strip()})
    return docs


def jsonl_labels(path: Path, split: str, opts: dict) -> list[dict]:
    """PIQA / SIQA: ``<name>.jsonl`` and its answers, one a line, in ``<name>-labels.lst`` (``label``, an int)."""
    docs = read_jsonl(_need(path, "JSONL file"))
    lst = path.with_name(opts.get("labels") or path.name.removesuffix(".jsonl") + "-labels.lst")
    labels = [x.strip() for x in _need(lst, "labels file").read_text(encoding="utf-8").splitlines() if x.strip()]
    if len(labels) != len(docs) or not all(x.lstrip("-").isdigit() for x in labels):
        raise BadInput(str(lst), None, f"expected one integer label per item of {path.name} ({len(docs)}), "
                       f"got {len(labels)} lines")
    return [d | {"label": int(x)} for d, x in zip(docs, labels, strict=True)]


def _bigbench_example(ex: dict, task: dict, sub: str, i: int, f: Path) -> dict:
    scores = ex.get("target_scores") or {}
    target = ex.get("target", [])
    if not isinstance(ex.get("input"), str) or not (scores or target):
        raise BadInput(str(f), None, f"example {i}: expected input and target or target_scores")
    mct, mcs = list(scores), list(scores.values())
    targets = [target] if isinstance(target, str) else [str(t) for t in target]
    return {"input": ex["input"], "targets": targets or [k for k in mct if scores[k] == max(mcs)],
            "multiple_choice_targets": mct, "multiple_choice_scores": mcs,
            "label": mcs.index(max(mcs)) if mcs else None, "task_prefix": task.get("task_prefix", ""),
            "input_prefix": task.get("example_input_prefix", "\nQ: "),
            "output_prefix": task.get("example_output_prefix", "\nA: "), "subtask": sub, "id": f"{sub}/{i}"}


def bigbench_json(path: Path, split: str, opts: dict) -> list[dict]:
    """A BIG-bench JSON task folder: the examples of its ``task.json`` and of its subtasks' ``<sub>/task.json``.

    ``target_scores`` gives the choices (``label``: the first best); ``target`` (one or a list) the
    generative targets. The prefixes are the task's own or BIG-bench's defaults (``"\\nQ: "``, ``"\\nA: "``).
    ``format_options.subtasks`` narrows to some subtasks (a task without subtasks is its own, by folder name).
    """
    _need(path, "BIG-bench task folder")
    tasks = {}
    for f in [path / "task.json", *sorted(path.glob("*/task.json"))]:
        if f.is_file():
            (t,) = read_json_one(f)
            if isinstance(t.get("examples"), list):
                tasks[f.parent.name] = (t, f)
    docs = []
    for sub in _names(opts, "subtasks", list(tasks), path):
        t, f = tasks[sub]
        docs += [_bigbench_example(ex, t, sub, i, f) for i, ex in enumerate(t["examples"])]
    return docs


_UPPER_DETERMINERS = ("A", "An", "The", "She", "He", "It", "They", "My", "His", "Her", "Their")


def _wsc_partial(text: str, pronoun: str, loc: int, option: str) -> str:
    """lm-eval's ``wsc273`` option normalisation for substituting the pronoun (possessive 's, lower case mid-sentence)."""
    if pronoun.lower() in ("my", "his", "her", "our", "their"):
        option += "'s"
    first = option.split()[0]
    if text[loc - 2] != "." and first in _UPPER_DETERMINERS:
        return option.replace(first, first.lower())
    return option


def wsc_xml(path: Path, split: str, opts: dict) -> list[dict]:
    """Winograd Schema Challenge ``WSCollection.xml`` in the hub's ``winograd_wsc`` layout.

    ``format_options.first: 273`` keeps the first 273 schemas (WSC273).
    """
    import xml.etree.ElementTree as ET

    def clean(x: str | None) -> str:
        return " ".join((x or "").split())

    try:
        root = ET.parse(_need(path, "WSC XML")).getroot()
    except ET.ParseError as e:
        raise BadInput(str(path), e.position[0], f"malformed XML: {e}") from None
    docs = []
    for i, s in enumerate(root.findall("schema")[: opts.get("first")]):
        left, pron, right = (clean(s.findtext(f"text/{k}")) for k in ("txt1", "pron", "txt2"))
        options = [clean(a.text) for a in s.findall("answers/answer")]
        correct = (s.findtext("correctAnswer") or "").strip().rstrip(".").strip()
        if len(options) != 2 or not all(options) or correct not in ("A", "B") or not pron:
            raise BadInput(str(path), None, f"schema {i}: expected txt1, pron, txt2, two answers, correctAnswer A|B")
        text, loc = f"{left} {pron} {right}".strip(), len(left) + 1 if left else 0
        docs.append({"id": str(i), "text": text, "pronoun": pron, "pronoun_loc": loc, "options": options,
                     "label": "AB".index(correct), "source": clean(s.findtext("source")),
                     "partial_options": [_wsc_partial(text, pron, loc, o) for o in options]})
    return docs


def squad_json(path: Path, split: str, opts: dict) -> list[dict]:
    """SQuAD v1.1 ``<split>-v1.1.json`` (articles → paragraphs → qas), one item per question (hub layout)."""
    docs = []
    for art in read_json(_need(path, "SQuAD file")):
        for para in art.get("paragraphs") or []:
            for qa in para.get("qas") or []:
                ans = qa.get("answers") or []
                if not ans:
                    raise BadInput(str(path), None, f"question {qa.get('id')}: no answers (SQuAD v1.1 expected)")
                docs.append({"id": qa["id"], "title": art.get("title", ""), "context": para["context"],
                             "question": qa["question"], "answers": {"text": [a["text"] for a in ans],
                                                                     "answer_start": [a["answer_start"] for a in ans]}})
    return docs


def coqa_json(path: Path, split: str, opts: dict) -> list[dict]:
    """CoQA ``coqa-<split>-v1.0.json``: one item per question turn, with the story and the turns before it.

    ``answers``: the turn's answer and the other annotators' (``additional_answers``), case-insensitively
    unique, as lm-eval's ``coqa``.
    """
    docs = []
    for st in read_json(_need(path, "CoQA file")):
        qs, ans, extra = st.get("questions") or [], st.get("answers") or [], st.get("additional_answers") or {}
        if len(qs) != len(ans):
            raise BadInput(str(path), None, f"story {st.get('id')}: {len(qs)} questions, {len(ans)} answers")
        for i, (q, a) in enumerate(zip(qs, ans, strict=True)):
            answers = [a["input_text"]]
            for alt in extra.values():
                x = alt[i]["input_text"] if i < len(alt) else None
                if x is not None and x.lower() not in map(str.lower, answers):
                    answers.append(x)
            docs.append({"id": f"{st['id']}/{q['turn_id']}", "story": st["story"], "question": q["input_text"],
                         "history": [{"question": x["input_text"], "answer": y["input_text"]}
                                     for x, y in zip(qs[:i], ans[:i], strict=True)],
                         "answer": a["input_text"], "answers": answers, "turn_id": q["turn_id"],
                         "source": st.get("source", "")})
    return docs


def triviaqa_json(path: Path, split: str, opts: dict) -> list[dict]:
    """TriviaQA ``qa/<source>-<split>.json`` (``{"Data": [{Question, QuestionId, Answer}]}``) in the hub layout."""
    obj = load_json(_need(path, "TriviaQA file"))
    rows = obj.get("Data") if isinstance(obj, dict) else None
    if not isinstance(rows, list):
        raise BadInput(str(path), None, 'expected {"Data": [...]} (a TriviaQA qa/*.json file)')
    docs = []
    for d in rows:
        a = d.get("Answer") or {}
        if "Question" not in d or "Value" not in a:
            raise BadInput(str(path), None, f"question {d.get('QuestionId')}: expected Question and Answer.Value")
        docs.append({"question_id": d.get("QuestionId", str(len(docs))), "question": d["Question"],
                     "answer": {"value": a["Value"], "aliases": a.get("Aliases") or [a["Value"]],
                                "normalized_value": a.get("NormalizedValue", ""),
                                "normalized_aliases": a.get("NormalizedAliases") or []}})
    return docs


def subsample(docs: list[dict], n: int, seed: int = 1234) -> list[dict]:
    """A fixed random subset of ``n`` documents, in their file order (all when there are not more)."""
    if n >= len(docs):
        return docs
    return [docs[i] for i in sorted(random.Random(seed).sample(range(len(docs)), n))]


def _jsonl(path: Path, split: str, opts: dict) -> list[dict]:
    return read_jsonl(_need(path, "JSONL file"))


def _json(path: Path, split: str, opts: dict) -> list[dict]:
    return read_json(_need(path, "JSON file"))


READERS: dict[str, Callable[[Path, str, dict], list[dict]]] = {
    "jsonl": _jsonl, "json": _json, "math_tree": math_tree, "mmlu_csv": mmlu_csv, "ceval_csv": ceval_csv,
    "cmmlu_csv": cmmlu_csv, "agieval_jsonl": agieval_jsonl, "bbh_json": bbh_json, "bbh_cot": bbh_cot,
    "mathqa_json": mathqa_json, "asdiv_xml": asdiv_xml, "arc_jsonl": arc_jsonl, "mbpp_jsonl": mbpp_jsonl,
    "scieval_json": scieval_json, "cmdgen": cmdgen, "jsonl_labels": jsonl_labels, "bigbench_json": bigbench_json,
    "wsc_xml": wsc_xml, "squad_json": squad_json, "coqa_json": coqa_json, "triviaqa_json": triviaqa_json,
}


def read(fmt: str, path: Path, split: str, opts: dict[str, Any] | None = None) -> list[dict]:
    """Read one split with the reader ``fmt`` (``sample``/``sample_seed`` options: :func:`subsample`)."""
    if fmt not in READERS:
        raise CptkitError(f"data_format {fmt!r}: use one of {', '.join(READERS)}")
    opts = dict(opts or {})
    n, seed = opts.pop("sample", None), int(opts.pop("sample_seed", 1234))
    docs = READERS[fmt](path, split, opts)
    return subsample(docs, int(n), seed) if n else docs
