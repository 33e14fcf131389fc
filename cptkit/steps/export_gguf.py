"""export-gguf: write a trained model directory (``train``'s ``model/``) as one GGUF file that
llama.cpp and ``cptkit serve-llm llm.model=FILE.gguf`` run.

``cptkit export-gguf --model runs/replay/model --out replay.gguf export.dtype=q8_0``. Llama-family
models (SmolLM2, Llama, Mistral); tokenizers are byte-level BPE from ``tokenizer.json`` or copied
from the GGUF the model was continued from (``export.tokenizer_from=smollm2`` or a ``.gguf``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cptkit.core.config import JobConfig, check
from cptkit.core.errors import CptkitError
from cptkit.core.output import check_output_file
from cptkit.core.progress import print_summary, setup_logging
from cptkit.core.run import Run
from cptkit.core.step import QUIET, Option, step
from cptkit.models.gguf import DTYPES, export_gguf


@dataclass
class ExportConfig:
    model: str | None = None  # --model: an HF model directory (train's output/model)
    dtype: str = "f16"  # f32 (exact) | f16 | q8_0
    tokenizer_from: str | None = None  # copy tokenizer metadata from this GGUF (or smollm2) instead of tokenizer.json

    def __post_init__(self) -> None:
        check(self.dtype in DTYPES, "dtype", self.dtype, f"must be one of {', '.join(DTYPES)}")


@dataclass
class ExportGGUFJob(JobConfig):
    trust_remote_code: bool = False  # let the --model folder run its own Python code (auto_map)
    export: ExportConfig = field(default_factory=ExportConfig)


MODEL = Option(("--model", "-m"), "export.model", "The model directory to export (train's model/).")
OUT_FILE = Option(("--out", "-o"), "io.output", "The GGUF file to write.")


@step("export-gguf", ExportGGUFJob, options=(MODEL, OUT_FILE, QUIET), order=145)
def run(conf: ExportGGUFJob, ctx: Run) -> dict:
    from pathlib import Path

    from cptkit.models.lm import check_gguf, resolve_spec  # deferred: torch

    setup_logging(conf.quiet)
    if not conf.export.model or not Path(conf.export.model).is_dir():
        raise CptkitError(f"export-gguf: --model {conf.export.model}: not a model directory")
    if not conf.io.output or conf.io.output == "-":
        raise CptkitError("export-gguf: --out FILE.gguf is required (a file, not stdout)")
    check_output_file(conf.io.output)
    src = None
    if conf.export.tokenizer_from:
        d, f = resolve_spec(conf.export.tokenizer_from)
        src = Path(d) / f if f else Path(d)
        check_gguf(src)  # what is copied from it is read as the model's GGUF is: a bad file is one line
    out = export_gguf(conf.export.model, conf.io.output, dtype=conf.export.dtype, tokenizer_from=src,
                      trust_remote_code=conf.trust_remote_code)
    rows = {"model": conf.export.model, "gguf": str(out), "dtype": conf.export.dtype,
            "MiB": round(out.stat().st_size / 2**20, 1)}
    print_summary("export-gguf", rows, quiet=conf.quiet)
    return rows
