"""How long a short request waits while a long one runs on `cptkit serve-llm` (the tiny test model).

Starts the server from ``--root`` (a cptkit checkout: compare a branch with an older one), sends a
long request (``--long-tokens`` at temperature 3, which the tiny model runs to its end), waits
``--head-start`` seconds, then times a ``--short-tokens`` request; prints both latencies in seconds.
``--stops N --stop-chars L``: the long request carries N stop strings of L characters (that never match),
as a hostile client's would (a server that refuses them answers the long request 400 at once).

    python bench/serve_fairness.py --root . --long-tokens 400
    python bench/serve_fairness.py --root . --long-tokens 200 --short-tokens 32 --stops 16 --stop-chars 256
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(f"{url}/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read()) | {"status": r.status}
    except urllib.error.HTTPError as e:  # a refused request: its status and message
        return json.loads(e.read()) | {"status": e.code}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=".")
    ap.add_argument("--long-tokens", type=int, default=400)
    ap.add_argument("--head-start", type=float, default=0.5)
    ap.add_argument("--short-tokens", type=int, default=3)
    ap.add_argument("--stops", type=int, default=0)
    ap.add_argument("--stop-chars", type=int, default=50)
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests._tiny_llm import cached_tiny_model

    ready = Path(tempfile.mkdtemp()) / "url"
    root = Path(a.root).resolve()
    proc = subprocess.Popen([sys.executable, "-m", "cptkit.cli", "serve-llm", f"llm.model={cached_tiny_model()}",
                             "llm.device=cpu", "llm.num_threads=1", "serve.port=0", f"serve.ready_file={ready}",
                             "quiet=true"], cwd=root, env={**os.environ, "PYTHONPATH": str(root)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not ready.exists():
            time.sleep(0.1)
        url = ready.read_text()
        long_out: dict = {}
        t0 = time.perf_counter()

        def run_long() -> None:
            stops = {"stop": [f"{i:05d}" + "x" * (a.stop_chars - 5) for i in range(a.stops)]} if a.stops else {}
            long_out.update(post(url, {"prompt": "Psychology studies", "max_tokens": a.long_tokens,
                                       "temperature": 3.0, "seed": 15, **stops}))
            long_out["s"] = time.perf_counter() - t0

        th = threading.Thread(target=run_long)
        th.start()
        time.sleep(a.head_start)
        t1 = time.perf_counter()
        short = post(url, {"prompt": "Paris is", "max_tokens": a.short_tokens, "seed": 1})
        short_s = time.perf_counter() - t1
        th.join()
        print(json.dumps({"root": str(root), "long_status": long_out["status"],
                          "long_tokens": long_out.get("usage", {}).get("completion_tokens"),
                          "long_s": round(long_out["s"], 2), "short_tokens": short["usage"]["completion_tokens"],
                          "short_s": round(short_s, 2)}))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
