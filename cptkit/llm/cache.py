"""Disk cache of completions: one SQLite file (WAL mode) under ``llm.cache_dir``.

Keys are sha256 hex digests of (model, request, sampling params, seed, chat mode); values are
the completion as JSON. Every finished batch is committed, so a killed run loses at most the
batch in flight. Several processes (shard jobs) may share one cache on a local disk; SQLite
locking is unreliable on some network file systems, so give each node its own cache there.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.core.redact import mask_known

FILE = "completions.sqlite"


class CompletionCache:
    def __init__(self, directory: str):
        self.dir = Path(directory).expanduser()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(self.dir / FILE, timeout=60, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("CREATE TABLE IF NOT EXISTS completions (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            self.db.commit()
        except (OSError, sqlite3.Error) as e:
            raise CptkitError(f"llm.cache_dir={directory}: cannot open the completion cache ({e})") from None

    def get_many(self, keys: list[str]) -> list[dict[str, Any] | None]:
        found: dict[str, dict[str, Any]] = {}
        uniq = list(dict.fromkeys(keys))
        for i in range(0, len(uniq), 500):
            chunk = uniq[i:i + 500]
            rows = self.db.execute(f"SELECT key, value FROM completions WHERE key IN ({','.join('?' * len(chunk))})",
                                   chunk).fetchall()
            found.update((k, json.loads(v)) for k, v in rows)
        return [found.get(k) for k in keys]

    def put_many(self, items: list[tuple[str, dict[str, Any]]]) -> None:
        with self.db:
            self.db.executemany("INSERT OR REPLACE INTO completions (key, value) VALUES (?, ?)",
                                [(k, mask_known(json.dumps(v, ensure_ascii=False))) for k, v in items])

    def __len__(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM completions").fetchone()[0])

    def close(self) -> None:
        self.db.close()
