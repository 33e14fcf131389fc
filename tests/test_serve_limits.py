"""serve-llm refuses an oversized request body (413) before reading it, and keeps serving."""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

from cptkit.llm.serve import MAX_BODY_BYTES
from tests._tiny_llm import cached_tiny_model

ROOT = Path(__file__).resolve().parent.parent


def test_body_over_the_cap_gets_413_and_the_server_keeps_serving(tmp_path):
    tiny = cached_tiny_model()
    ready = tmp_path / "url"
    proc = subprocess.Popen([sys.executable, "-m", "cptkit.cli", "serve-llm", f"llm.model={tiny}", "llm.device=cpu",
                             "llm.num_threads=1", "serve.port=0", f"serve.ready_file={ready}", "quiet=true"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.1)
        assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "server did not start"
        url = urlsplit(ready.read_text())
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        conn.putrequest("POST", "/v1/completions")
        conn.putheader("Content-Type", "application/json")
        conn.putheader("Content-Length", str(MAX_BODY_BYTES + 1))  # announced, never sent
        conn.endheaders()
        conn.send(b'{"prompt": "')
        resp = conn.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 413
        assert body["error"]["message"] == (f"request body of {MAX_BODY_BYTES + 1:,} bytes is over the limit of "
                                            f"{MAX_BODY_BYTES:,} bytes")
        conn.close()

        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "Paris is", "max_tokens": 3, "seed": 1}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        assert json.loads(resp.read())["usage"]["completion_tokens"] <= 3
        conn.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
