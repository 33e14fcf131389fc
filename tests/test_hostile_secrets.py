"""No secret in any file, log or error: `cptkit expand-queries` end to end against a real local
OpenAI-compatible HTTP server started here, one process per case, then every byte of every file
under the output directory (and the completion cache) and of stdout/stderr is scanned for it.

The server answers canned completions under ``/ok/v1`` and, under ``/echo/v1``, fails every
completion with HTTP 400 whose body echoes the request's Authorization header (some servers do).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def _send(self, code: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:  # noqa: N802
        self.server.seen.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        self._send(200, {"object": "list", "data": [{"id": "canned", "object": "model"}]})

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.seen.append(self.headers.get("Authorization"))  # type: ignore[attr-defined]
        if self.path.startswith("/echo/"):
            return self._send(400, {"error": {"message": f"invalid credentials: {self.headers.get('Authorization')}"}})
        text = "What is the role of mitochondria in cellular respiration?"
        if self.path.startswith("/leak/"):  # a server that puts the header in its answer
            text = f"What is the role of {self.headers.get('Authorization')} in cellular respiration?"
        self._send(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 5, "completion_tokens": 9}})


@pytest.fixture(scope="module")
def api():
    """Base address ``http://127.0.0.1:PORT`` of the canned OpenAI-compatible server."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.seen = []  # type: ignore[attr-defined]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def expand(tmp_path: Path, base_url: str, *extra: str, env: dict[str, str] | None = None):
    """Run `cptkit expand-queries` on one seed against ``base_url``: (exit code, out dir, stdout + stderr)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text('{"id": "s1", "text": "biology", "domain": "STEM"}\n')
    out = tmp_path / "q"
    argv = [sys.executable, "-m", "cptkit.cli", "expand-queries", f"io.inputs=[{seeds}]", f"io.output={out}", "llm=openai",
            f"llm.base_url={base_url}", f"llm.cache_dir={tmp_path / 'cache'}", "llm.max_retries=0",
            "expand.rounds=1", "expand.questions_per_seed=1", *extra]
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, env={**os.environ, **(env or {})}, timeout=300)
    return p.returncode, out, p.stdout + p.stderr


def assert_nowhere(secret: str, tmp_path: Path, printed: bytes) -> int:
    """The secret is in no byte printed and no file under ``tmp_path`` (gzip shards decompressed):
    the number of files scanned."""
    assert secret.encode() not in printed, printed.decode(errors="replace")[-2000:]
    n = 0
    for f in tmp_path.rglob("*"):
        if f.is_file():
            data = f.read_bytes()
            if f.suffix == ".gz":
                data = gzip.decompress(data)
            at = data.find(secret.encode())
            assert at < 0, f"{f}: {data[max(0, at - 200):at + 200]!r}"
            n += 1
    return n


def test_an_auth_header_echoed_back_in_an_error(api, tmp_path):
    secret = "sk-echo-" + os.urandom(8).hex()
    code, out, printed = expand(tmp_path, f"http://127.0.0.1:{api.server_port}/echo/v1", "llm.api_key_env=MY_LLM_CRED",
                                env={"MY_LLM_CRED": secret})
    assert code == 2 and b"failed with HTTP 400: " in printed and b"invalid credentials: " in printed
    assert f"Bearer {secret}" in api.seen  # the key did reach the server
    assert_nowhere(secret, tmp_path, printed)


def test_an_api_key_in_the_base_url_query(api, tmp_path):
    secret = "q-" + os.urandom(8).hex()
    code, out, printed = expand(tmp_path, f"'http://127.0.0.1:{api.server_port}/ok/v1?api_key={secret}&v=1'")
    assert code == 0, printed.decode(errors="replace")
    stats = json.loads((out / "_expand_stats.json").read_text())
    assert "/ok/v1?api_key=<redacted>&v=1" in json.dumps(stats)
    assert list((out / ".cptkit").glob("*")), "no resume markers to scan"
    assert assert_nowhere(secret, tmp_path, printed) >= 4


def test_a_token_as_url_user(api, tmp_path):
    secret = "ghp" + os.urandom(10).hex()
    code, out, printed = expand(tmp_path, f"http://{secret}@127.0.0.1:{api.server_port}/ok/v1")
    assert code == 0, printed.decode(errors="replace")
    assert "http://<redacted>@127.0.0.1" in (out / "_manifest.json").read_text()
    assert_nowhere(secret, tmp_path, printed)
    # the same URL where nothing answers: the error names the URL without the token
    code, _, printed = expand(tmp_path / "down", f"http://{secret}@127.0.0.1:1/v1")
    assert code == 2 and b"llm.base_url=http://<redacted>@127.0.0.1:1/v1" in printed
    assert_nowhere(secret, tmp_path, printed)


def test_an_env_interpolation_in_the_config(api, tmp_path):
    secret = "aws/" + os.urandom(12).hex()
    code, out, printed = expand(tmp_path, f"http://127.0.0.1:{api.server_port}/ok/v1",
                                "llm.system=${oc.env:AWS_SECRET_ACCESS_KEY}", env={"AWS_SECRET_ACCESS_KEY": secret})
    assert code == 0, printed.decode(errors="replace")
    assert json.loads((out / "_manifest.json").read_text())["config"]["llm"]["system"] == "<redacted>"
    assert_nowhere(secret, tmp_path, printed)


def test_a_key_the_server_puts_into_a_completion_is_masked_in_the_records(api, tmp_path):
    secret = "sk-leak-" + os.urandom(8).hex()
    code, out, printed = expand(tmp_path, f"http://127.0.0.1:{api.server_port}/leak/v1", "llm.api_key_env=MY_LLM_CRED",
                                env={"MY_LLM_CRED": secret})
    assert code == 0, printed.decode(errors="replace")
    records = b"".join(gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
                       for f in out.glob("*.jsonl*"))
    assert b"Bearer <redacted>" in records  # the record is kept, the key masked
    assert_nowhere(secret, tmp_path, printed)


def test_a_url_given_as_a_path_is_masked_in_a_module_error(tmp_path):
    """A module command (``cptkit margin``: cptkit.core.errors.cli_main) reports as the CLI does, secrets masked,
    also after pathlib has folded the URL's ``//`` into ``/`` (``https:/user:pw@host``)."""
    r = subprocess.run([sys.executable, "-m", "cptkit.cli", "margin", "--model", str(tmp_path / "none"),
                        "--pairs", "https://user:hunter2@example.invalid/p.jsonl", "--out", str(tmp_path / "m.json")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "p.jsonl: no such file" in r.stderr, r.stderr
    assert "hunter2" not in r.stderr + r.stdout and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "m.json").exists()
