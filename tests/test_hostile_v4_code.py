"""Hostile input v4, code execution: a shared task file, model folder, GGUF file or config file
must not run code on the host, and must be refused in one line naming it (exit 2), with nothing
written. Real parts throughout: a tiny Llama and BPE tokenizer saved to disk, the real CLI."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import run_main, write_jsonl

from cptkit.core.config import compose_step
from cptkit.core.discovery import step_module
from cptkit.core.errors import CptkitError
from cptkit.eval import tasks, templates
from cptkit.eval.task_data import load_docs
from cptkit.models import lm
from cptkit.models.remote_code import needs_remote_code
from cptkit.models.tiny import tiny_llama, train_bpe_tokenizer

TEXTS = ["the cell makes proteins and the proteins fold into shapes. What is 1+1? 2. What is 2+2? 4."] * 20
DOMAIN = ["mix.domains=[{name:all,filter:{}}]", "mix.stages=[{name:main,weights:{all:1}}]", "mix.fill=null",
          "mix.seq_len=16", "mix.budget_tokens=2000", "mix.eval_docs=2"]
# what a shared model folder's Python files do when imported: leave a marker, then define the
# classes its config.json / tokenizer_config.json name in auto_map (a Llama under another name)
EVIL_CODE = """import pathlib
pathlib.Path({marker!r}).write_text("ran")
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
class EvilConfig(LlamaConfig):
    model_type = "evil"
class EvilForCausalLM(LlamaForCausalLM):
    config_class = EvilConfig
class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""


def cli(argv: list, capsys, stdin: str = "y\ny\ny\n") -> tuple[int, str]:
    """``cptkit ARGV`` in-process, answering ``stdin`` to any prompt: (exit code, stderr)."""
    capsys.readouterr()
    code = run_main(argv, stdin)
    return code, capsys.readouterr().err


def one_line(code: int, err: str, *words: str) -> str:
    """Assert exit 2 and a single ``error:`` line naming every one of ``words``."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err[-3000:])
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A tiny real Llama and its BPE tokenizer, saved as an HF folder."""
    d = tmp_path_factory.mktemp("tiny") / "model"
    tok = train_bpe_tokenizer(TEXTS, vocab_size=300)
    tiny_llama(tok, hidden=32, layers=1, heads=2, max_position=256).save_pretrained(d)
    tok.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("corpus")
    write_jsonl(d / "part-0.jsonl", [{"id": f"d{i}", "text": f"document {i}: {TEXTS[0]}"} for i in range(40)])
    return d


@pytest.fixture(scope="module")
def task_data(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("task")
    write_jsonl(d / "test.jsonl", [{"q": "What is 1+1?", "a": "2"}, {"q": "What is 2+2?", "a": "4"}])
    return d


def task_file(d: Path, name: str, doc_to_text: str) -> Path:
    spec = {"task": name, "output_type": "generate_until", "data_files": {"test": str(d / "test.jsonl")},
            "test_split": "test", "doc_to_text": doc_to_text, "doc_to_target": "{{a}}",
            "generation_kwargs": {"until": ["\n"], "max_gen_toks": 2}}
    path = d / f"{name}.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def evil_folder(tiny: Path, dest: Path, marker: Path, model: bool = True) -> Path:
    """A copy of ``tiny`` whose configs name Python files of the folder (``auto_map``), as a shared
    custom-code model does; ``model=False``: the tokenizer files alone."""
    shutil.copytree(tiny, dest)
    (dest / "modeling_evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    (dest / "tokenization_evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    tc = json.loads((dest / "tokenizer_config.json").read_text())
    tc.update(tokenizer_class="EvilTokenizer", auto_map={"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]})
    (dest / "tokenizer_config.json").write_text(json.dumps(tc))
    if not model:
        for f in ("config.json", "model.safetensors", "generation_config.json", "modeling_evil.py"):
            (dest / f).unlink(missing_ok=True)
        return dest
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(model_type="evil", architectures=["EvilForCausalLM"],
               auto_map={"AutoConfig": "modeling_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"})
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


# --- 1. task templates are sandboxed ------------------------------------------------------------
PAYLOADS = [
    "{{ cycler.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ joiner.__init__.__globals__.os.popen('touch MARKER').read() }}",
    "{{ lipsum.__globals__['os'].system('touch MARKER') }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}{{ q|attr('__class__') }}",
    "{% set x = [] %}{{ x.append(q) }}",  # the immutable sandbox: no mutation either
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_template_sandbox_refuses_python_internals(task_data, tmp_path, payload):
    marker = tmp_path / "x"
    t = tasks.load_task(str(task_file(task_data, f"p{PAYLOADS.index(payload)}",
                                      payload.replace("MARKER", str(marker)))), str(task_data), str(task_data))
    with pytest.raises(CptkitError) as e:
        templates.check_templates(t)
    assert str(t.path) in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()


def test_plain_templates_still_render(task_data):
    t = tasks.load_task(str(task_file(task_data, "plain", "Q: {{q.strip()|upper}} {{ '%s!'|format(a) }}\nA:")),
                        str(task_data), str(task_data))
    templates.check_templates(t)
    assert templates.doc_to_text(t, load_docs(t, "test")[0]) == "Q: WHAT IS 1+1? 2!\nA:"


def test_task_file_with_cycler_payload_runs_nothing(tiny, task_data, tmp_path, capsys):
    marker = tmp_path / "x"
    task = task_file(task_data, "evil", "{{ cycler.__init__.__globals__.os.system('id > MARKER') }}"
                     .replace("MARKER", str(marker)))
    out = tmp_path / "out"
    code, err = cli(["evaluate", "--model", tiny, "--out", out, "-q", f"eval.tasks=[{task}]"], capsys)
    assert not marker.exists(), "the template ran a shell command"
    one_line(code, err, str(task), "sandbox")
    assert not out.exists()


# --- 2. model folders never run their own code unless asked ---------------------------------------
def test_what_needs_remote_code(tiny, tmp_path):
    assert needs_remote_code(tiny) is None
    evil = evil_folder(tiny, tmp_path / "evil", tmp_path / "m")
    assert "auto_map" in needs_remote_code(evil)
    tok_only = evil_folder(tiny, tmp_path / "tok", tmp_path / "m", model=False)
    assert "tokenizer_config.json" in needs_remote_code(tok_only)
    unknown = shutil.copytree(tiny, tmp_path / "unknown")
    cfg = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**cfg, "model_type": "not_a_transformers_model"}))
    assert "not_a_transformers_model" in needs_remote_code(unknown)
    known_with_map = shutil.copytree(tiny, tmp_path / "llama_map")  # transformers would load Llama, not its code
    (known_with_map / "config.json").write_text(json.dumps({**cfg, "auto_map": {"AutoModel": "m.M"}}))
    assert "auto_map" in needs_remote_code(known_with_map)


def stream(tiny: Path, corpus: Path, tmp_path: Path, capsys) -> Path:
    out = tmp_path / "stream"
    code, err = cli(["build-mix", "--in", corpus, "--out", out, "-q", "mix=demo", f"tokenizer={tiny}", *DOMAIN],
                    capsys)
    assert code == 0, err
    return out


@pytest.mark.parametrize("step", ["evaluate", "train", "build-mix", "export-gguf"])
def test_remote_code_folder_is_refused_even_after_yes(step, tiny, corpus, task_data, tmp_path, capsys):
    marker, out = tmp_path / "marker", tmp_path / "out"
    evil = evil_folder(tiny, tmp_path / f"evil_{step.replace('-', '_')}", marker, model=step != "build-mix")
    argv = {
        "evaluate": ["evaluate", "--model", evil, "--out", out, "-q",
                     f"eval.tasks=[{task_file(task_data, 'plain', 'Q: {{q}}')}]"],
        "train": ["train", "--in", stream(tiny, corpus, tmp_path, capsys) if step == "train" else "", "--out", out, "-q",
                  "model=hf", f"model.path={evil}", "train.max_steps=1", "train.micro_batch=2", "train.threads=1"],
        "build-mix": ["build-mix", "--in", corpus, "--out", out, "-q", "mix=demo", f"tokenizer={evil}", *DOMAIN],
        "export-gguf": ["export-gguf", "--model", evil, "--out", tmp_path / "out.gguf", "-q"],
    }[step]
    code, err = cli(argv, capsys, stdin="y\n" * 4)
    assert not marker.exists(), "the folder's code ran"
    one_line(code, err, str(evil), "trust_remote_code=true")
    assert not out.exists() and not (tmp_path / "out.gguf").exists()


def test_opting_in_reaches_from_pretrained(tiny, task_data, tmp_path, capsys):
    """``trust_remote_code=true`` does load the folder's own classes (its code runs: the marker)."""
    marker, out = tmp_path / "marker", tmp_path / "out"
    evil = evil_folder(tiny, tmp_path / "evil_opt_in", marker)
    held = write_jsonl(tmp_path / "held" / "part-0.jsonl", [{"id": f"h{i}", "text": TEXTS[0]} for i in range(3)])
    code, err = cli(["evaluate", "--model", evil, "--in", held.parent, "--out", out, "-q", "trust_remote_code=true"],
                    capsys, stdin="")
    assert code == 0, err
    assert marker.read_text() == "ran"
    results = json.loads((out / "_results.json").read_text())
    assert results["model"]["class"] == "EvilForCausalLM" and results["perplexity"]
    assert type(lm.load_tokenizer(str(evil), trust_remote_code=True)).__name__ == "EvilTokenizer"


@pytest.mark.parametrize("step", ["evaluate", "train", "build-mix", "export-gguf"])
def test_trust_remote_code_is_a_checked_boolean(step):
    step_module(step)  # registers the step's schema
    assert compose_step(step, [])["trust_remote_code"] is False
    with pytest.raises(CptkitError, match="trust_remote_code.*maybe.*bool"):
        compose_step(step, ["trust_remote_code=maybe"])


# --- 8. one line, not a traceback -----------------------------------------------------------------
def test_random_bytes_as_gguf_is_one_line(task_data, tmp_path, capsys):
    bad = tmp_path / "random.gguf"
    bad.write_bytes(os.urandom(4096))
    out = tmp_path / "out"
    code, err = cli(["evaluate", "--model", bad, "--out", out, "-q",
                     f"eval.tasks=[{task_file(task_data, 'plain', 'Q: {{q}}')}]"], capsys)
    one_line(code, err, str(bad), "not a readable GGUF file")
    assert not out.exists()
    trunc = tmp_path / "short.gguf"
    trunc.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 8)  # the magic, then a header cut short
    code, err = cli(["evaluate", "--model", trunc, "--out", out, "-q",
                     f"eval.tasks=[{task_file(task_data, 'plain', 'Q: {{q}}')}]"], capsys)
    one_line(code, err, str(trunc), "not a readable GGUF file")


def test_truncated_real_gguf_is_one_line(smollm2, tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(smollm2, "rb") as f:
        cut.write_bytes(f.read(2_000_000))  # the whole header and tensor table, a fraction of the data
    with pytest.raises(CptkitError, match=r"cut.gguf: truncated GGUF file: its tensors end at byte"):
        lm.check_model(str(cut))
    lm.check_model(smollm2)  # the whole file passes


def test_serve_llm_random_gguf_is_one_line(tmp_path, capsys):
    bad = tmp_path / "random.gguf"
    bad.write_bytes(os.urandom(4096))
    code, err = cli(["serve-llm", f"llm.model={bad}", "llm.backend=transformers", "serve.port=0", "quiet=true"],
                    capsys)  # refused while loading: never reaches serving
    one_line(code, err, str(bad), "not a readable GGUF file")


@pytest.mark.parametrize("sweep", [False, True])
def test_python_tag_in_a_searchpath_config_is_one_line(tmp_path, capsys, sweep):
    marker = tmp_path / "pwn"
    (tmp_path / "sp" / "mix").mkdir(parents=True)
    evil = tmp_path / "sp" / "mix" / "evil.yaml"
    evil.write_text(f"# @package mix\nname: evil\nx: !!python/object/apply:os.system ['touch {marker}']\n")
    out, sweep_dir = tmp_path / "out", tmp_path / "sweep"
    argv = ["build-mix", "--in", tmp_path, "--out", out, "-q", f"hydra.searchpath=[file://{tmp_path / 'sp'}]",
            "tokenizer=unused"]
    argv += ["-m", "mix=demo,evil", "seed=1,2", f"hydra.sweep.dir={sweep_dir}"] if sweep else ["mix=evil"]
    code, err = cli(argv, capsys)
    one_line(code, err, f"{evil}:3", "!!python/object/apply:os.system")
    assert not marker.exists() and not out.exists() and not sweep_dir.exists()
