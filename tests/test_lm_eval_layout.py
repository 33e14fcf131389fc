"""`evaluate` writes its task scores in lm-evaluation-harness's results layout, and lm-eval's own code, as
installed, reads the file: its results-file helpers (lm_eval.utils), make_table, the W&B logger's results
parsing, and the key layout its result_schema declares. A real `cptkit evaluate` run on the tiny test
model and a small multiple-choice task; the slow test compares with the file lm-eval itself writes."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cptkit.cli import app
from cptkit.eval.lm_eval_layout import metric_key
from tests._tiny_llm import cached_tiny_model

lm_eval = pytest.importorskip("lm_eval")

ITEMS = [("Paris", ["the capital of France", "a river in Spain", "a kind of fish"], 0),
         ("Meiosis", ["a city", "cell division into four haploid cells", "a law of motion"], 1),
         ("Water", ["hydrogen and oxygen", "a prime number", "a fall of Rome"], 0),
         ("Newton", ["a sociology book", "a chemical bond", "force equals mass times acceleration"], 2),
         ("Two", ["the only even prime", "a capital", "a cell"], 0),
         ("Sociology", ["studies society and its groups", "makes ATP", "a river"], 0)]
TASK = """task: tiny_defs
version: 2
output_type: multiple_choice
data_files: {{test: {test}}}
test_split: test
num_fewshot: 0
doc_to_text: "Word: {{{{word}}}}\\nDefinition:"
doc_to_choice: choices
doc_to_target: label
"""


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("task")
    (d / "test.jsonl").write_text("".join(json.dumps({"word": w, "choices": c, "label": y}) + "\n"
                                          for w, c, y in ITEMS))
    (d / "tiny_defs.yaml").write_text(TASK.format(test=d / "test.jsonl"))
    return d / "tiny_defs.yaml"


def evaluate(out: Path, task: Path | str, *extra: str) -> tuple[dict, dict, Path]:
    """(_results.json, _manifest.json, the results_*.json file) of one `cptkit evaluate` run."""
    res = CliRunner().invoke(app, ["evaluate", "--model", str(cached_tiny_model()), "--out", str(out), "-q",
                                   f"eval.tasks=[{task}]", "eval.device=cpu", *extra])
    assert res.exit_code == 0, res.output
    [f] = (out / "_lm_eval").glob("results_*.json")
    return json.loads((out / "_results.json").read_text()), json.loads((out / "_manifest.json").read_text()), f


def test_lm_eval_reads_the_results_file(task, tmp_path):
    from lm_eval.loggers.wandb_logger import WandbLogger
    from lm_eval.result_schema import EvalResults, _EvalConfig, _SampleCount, _TaskMetrics
    from lm_eval.utils import (
        get_file_datetime,
        get_latest_filename,
        get_results_filenames,
        make_table,
    )

    ours, man, f = evaluate(tmp_path / "a", task)
    data = json.loads(f.read_text())
    m = ours["tasks"]["tiny_defs"]["metrics"]
    # lm-eval finds it among the output's files, and its name carries the manifest's start time
    listing = [str(p) for p in sorted((tmp_path / "a").rglob("*")) if p.is_file()]
    assert get_results_filenames(listing) == [str(f)]
    day, clock = get_file_datetime(f.name).removesuffix(".json").split("T")
    started = datetime.fromisoformat(f"{day}T{clock.replace('-', ':')}").timestamp()
    assert started == pytest.approx(man["timings"]["started"], abs=1e-5)
    # the keys lm-eval's schema declares: top level, per task, sample counts, run config
    assert set(data) <= set(EvalResults.__annotations__)
    assert {"results", "versions", "n-shot", "configs", "config", "higher_is_better", "n-samples"} <= set(data)
    row = data["results"]["tiny_defs"]
    assert _TaskMetrics.__required_keys__ <= set(row) and row["alias"] == "tiny_defs" and row["sample_len"] == 6
    assert data["n-samples"]["tiny_defs"] == {"original": 6, "effective": 6}
    assert set(data["n-samples"]["tiny_defs"]) == _SampleCount.__required_keys__
    assert set(data["config"]) <= set(_EvalConfig.__annotations__)
    assert data["versions"] == {"tiny_defs": 2.0} and data["n-shot"] == {"tiny_defs": 0}
    assert data["higher_is_better"] == {"tiny_defs": {"acc": True, "acc_norm": True}}
    # the scores are _results.json's, under lm-eval's metric,filter keys
    assert {k: v for k, v in row.items() if "," in k} == {
        "acc,none": m["acc"], "acc_stderr,none": m["acc_stderr"],
        "acc_norm,none": m["acc_norm"], "acc_norm_stderr,none": m["acc_norm_stderr"]}
    # make_table prints them (what `lm_eval` prints after a run)
    table = make_table(data)
    acc_row = next(line for line in table.splitlines() if "|acc " in line)
    assert re.search(rf"\|tiny_defs\s*\|\s*2\s*\|none\s*\|\s*0\|acc\s*\|↑\s*\|{m['acc']:.4f}\|±\s*\|"
                     rf"{m['acc_stderr']:.4f}\|", acc_row), table
    # the W&B logger's parsing of a results dict
    logger = object.__new__(WandbLogger)  # no wandb run: only its results parsing
    logger.post_init(data)
    _, flat = logger._sanitize_results_dict()
    assert flat["tiny_defs/acc"] == m["acc"] and flat["tiny_defs/acc_norm_stderr"] == m["acc_norm_stderr"]
    # deterministic: a second run writes the same content, under its own start time; lm-eval picks it as latest
    _, _, f2 = evaluate(tmp_path / "b", task)
    assert json.loads(f2.read_text()) == data
    assert get_latest_filename([str(f), str(f2)]) == str(f2)


def test_lm_eval_metric_keys():
    assert metric_key("acc") == "acc,none" and metric_key("acc_norm_stderr") == "acc_norm_stderr,none"
    assert metric_key("exact_match/flexible-extract") == "exact_match,flexible-extract"
    assert metric_key("exact_match/flexible-extract_stderr") == "exact_match_stderr,flexible-extract"
    assert metric_key("pass@1") == "pass@1,none"


@pytest.mark.slow
def test_same_layout_and_numbers_as_the_file_lm_eval_writes(task, tmp_path, monkeypatch):
    """lm-eval 0.4.13 on the same model and task (as an lm-eval YAML), its file written by its own
    EvaluationTracker: cptkit's file has the same task keys, the same scores, versions and counts."""
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ours, _, f = evaluate(tmp_path / "c", task)
    mine = json.loads(f.read_text())
    inc = tmp_path / "lm_eval_tasks"
    inc.mkdir()
    (inc / "tiny_defs.yaml").write_text(
        "task: tiny_defs\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {task.parent / 'test.jsonl'}\noutput_type: multiple_choice\ntest_split: test\nnum_fewshot: 0\n"
        'doc_to_text: "Word: {{word}}\\nDefinition:"\ndoc_to_choice: choices\ndoc_to_target: label\n'
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\nmetadata:\n  version: 2.0\n")
    out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={cached_tiny_model()},dtype=float32",
                                  device="cpu", tasks=["tiny_defs"], batch_size=8,
                                  task_manager=TaskManager(include_path=str(inc)))
    tracker = EvaluationTracker(output_path=str(tmp_path / "lm"))
    tracker.save_results_aggregated(results=out, samples=None)
    [theirs_file] = (tmp_path / "lm").rglob("results_*.json")
    theirs = json.loads(theirs_file.read_text())
    assert set(mine) <= set(theirs)  # no key lm-eval itself does not write
    for key in ("results", "versions", "n-shot", "higher_is_better", "n-samples", "group_subtasks"):
        a, b = mine[key], theirs[key]
        if key == "results":
            a, b = ({k: v for k, v in x["tiny_defs"].items() if k not in ("name", "sample_len")} for x in (a, b))
            assert a.keys() == b.keys()
            assert all(a[k] == pytest.approx(b[k], abs=1e-6) if not isinstance(b[k], str) else a[k] == b[k] for k in b)
        else:
            assert a == b, key
    assert set(mine["config"]) <= set(theirs["config"])
    assert ours["tasks"]["tiny_defs"]["metrics"]["acc"] == theirs["results"]["tiny_defs"]["acc,none"]
    # eval.engine=lm_eval: the file keeps lm-eval's own task config, versions and counts
    _, _, f = evaluate(tmp_path / "d", "tiny_defs", "eval.engine=lm_eval", f"eval.lm_eval.include_path={inc}")
    via = json.loads(f.read_text())
    for key in ("versions", "n-shot", "higher_is_better", "n-samples"):
        assert via[key] == theirs[key], key
    assert via["configs"]["tiny_defs"]["dataset_kwargs"] == theirs["configs"]["tiny_defs"]["dataset_kwargs"]
    assert via["results"]["tiny_defs"].keys() == theirs["results"]["tiny_defs"].keys()
