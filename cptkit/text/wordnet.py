"""WordNet 3.0 from Debian's ``wordnet-base``, read with nltk, deterministic.

No PyPI package ships WordNet data, so the files come from the Debian package:
``/usr/share/wordnet`` when it is installed (``apt-get install wordnet-base``), or a copy fetched
with :func:`fetch_wordnet` (``apt-get download wordnet-base`` + ``dpkg -x``, no root needed).
They are copied into ``<cache>/corpora/wordnet`` (nltk refuses paths outside its data path
and symlinks) with the ``lexnames`` file nltk needs and Debian does not ship.

Pitfall handled here: nltk returns hypernyms/hyponyms in Python set order, which changes
with PYTHONHASHSEED; every list this module returns is sorted by synset name.
"""

from __future__ import annotations

import functools
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from cptkit.core.errors import CptkitError
from cptkit.core.fingerprint import content_hash
from cptkit.core.shards import atomic_write_bytes

SYSTEM_DIR = Path("/usr/share/wordnet")
DEFAULT_CACHE = Path(os.environ.get("CPTKIT_CACHE", Path.home() / ".cache" / "cptkit")) / "wordnet"
FILES = ("data.noun", "data.verb", "data.adj", "data.adv", "index.noun", "index.verb", "index.adj",
         "index.adv", "noun.exc", "verb.exc", "adj.exc", "adv.exc")

# WordNet 3.0 lexicographer files (lexnames(5WN)): number, name, syntactic category.
_LEXNAMES = """adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute
noun.body noun.cognition noun.communication noun.event noun.feeling noun.food noun.group
noun.location noun.motive noun.object noun.person noun.phenomenon noun.plant noun.possession
noun.process noun.quantity noun.relation noun.shape noun.state noun.substance noun.time verb.body
verb.change verb.cognition verb.communication verb.competition verb.consumption verb.contact
verb.creation verb.emotion verb.motion verb.perception verb.possession verb.social verb.stative
verb.weather adj.ppl""".split()
_POSNUM = {"adj": 3, "adv": 4, "noun": 1, "verb": 2}


def lexnames_text() -> str:
    return "".join(f"{i:02d}\t{n}\t{_POSNUM[n.split('.')[0]]}\n" for i, n in enumerate(_LEXNAMES))


def _complete(d: Path) -> bool:
    return all((d / f).is_file() for f in FILES)


def fetch_wordnet(cache: str | Path | None = None) -> Path:
    """Download Debian's ``wordnet-base`` with apt-get and unpack it; return its data dir."""
    cache = Path(cache or DEFAULT_CACHE)
    dest = cache / "debian"
    if _complete(dest / "usr/share/wordnet"):
        return dest / "usr/share/wordnet"
    if not shutil.which("apt-get") or not shutil.which("dpkg"):
        raise CptkitError("WordNet is missing and apt-get/dpkg are not available: install Debian's "
                          "wordnet-base or copy its /usr/share/wordnet here")
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run(["apt-get", "download", "wordnet-base"], cwd=tmp, capture_output=True, text=True)
        debs = glob.glob(os.path.join(tmp, "wordnet-base_*.deb"))
        if r.returncode != 0 or not debs:
            raise CptkitError(f"apt-get download wordnet-base failed: {(r.stderr or r.stdout).strip()[-300:]}")
        dest.mkdir(parents=True, exist_ok=True)
        subprocess.run(["dpkg", "-x", debs[0], str(dest)], check=True)
    return dest / "usr/share/wordnet"


def prepare(cache: str | Path | None = None, source: str | Path | None = None, fetch: bool = True) -> Path:
    """Make ``<cache>/corpora/wordnet`` (data files + lexnames) and return ``<cache>``.

    ``source``: a directory with the WordNet 3.0 database files; default the system copy,
    else a fetched copy (``fetch=True``), else a :class:`CptkitError` saying how to get it.
    """
    cache = Path(cache or DEFAULT_CACHE)
    target = cache / "corpora" / "wordnet"
    if _complete(target) and (target / "lexnames").exists():
        return cache
    src = Path(source) if source else (SYSTEM_DIR if _complete(SYSTEM_DIR) else None)
    if src is None:
        if not fetch:
            raise CptkitError("WordNet 3.0 not found: apt-get install wordnet-base, or set "
                              "corrupt.wordnet_fetch=true to apt-get download it into the cache")
        src = fetch_wordnet(cache)
    if not _complete(src):
        raise CptkitError(f"{src}: not a WordNet 3.0 database (needs {', '.join(FILES)})")
    target.mkdir(parents=True, exist_ok=True)
    for f in sorted(os.listdir(src)):
        if (src / f).is_file():
            shutil.copyfile(src / f, target / f)
    (target / "lexnames").write_text(lexnames_text())
    return cache


@functools.lru_cache(maxsize=4)
def load_wordnet(cache: str | None = None, source: str | None = None, fetch: bool = True) -> Any:
    """An nltk ``WordNetCorpusReader`` over the prepared copy (cached per process)."""
    import warnings

    import nltk
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    root = prepare(cache, source, fetch)

    class _Reader(WordNetCorpusReader):
        def map_wn(self, version: str = "wordnet") -> None:  # no sense-index mapping needed
            return None

        def _load_lemma_pos_offset_map(self) -> None:
            """nltk parses the four index files into {lemma: {pos: [offsets]}} in every process (~8 s
            of a short ``corrupt``); the result is kept as JSON next to them, keyed by their content."""
            _cached_lemma_map(self, root / "corpora" / "wordnet", super()._load_lemma_pos_offset_map)

    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _Reader(str(root / "corpora" / "wordnet"), None)


def _cached_lemma_map(reader: Any, data: Path, parse: Any) -> None:
    """Fill ``reader._lemma_pos_offset_map`` from ``data/.lemma-map-<key>.json``, or by ``parse()``
    and save it there (key: the WordNet files' digest and the nltk version)."""
    import hashlib
    import json

    import nltk

    digest = content_hash(data)
    key = hashlib.sha256(f"{digest}\0nltk {nltk.__version__}".encode()).hexdigest()[:16]
    f = data / f".lemma-map-{key}.json"
    try:
        reader._lemma_pos_offset_map.update(json.loads(f.read_text(encoding="utf-8")))
        return
    except (OSError, ValueError):
        reader._lemma_pos_offset_map.clear()
    parse()
    try:
        atomic_write_bytes(f, json.dumps(reader._lemma_pos_offset_map, ensure_ascii=False).encode("utf-8"))
    except OSError:
        pass  # a read-only copy: parse again next time


def _lemma_name(syn: Any) -> str:
    return syn.lemmas()[0].name().replace("_", " ")


def cohyponyms(wn: Any, word: str) -> list[tuple[str, str]]:
    """``(hypernym, co-hyponym)`` pairs for the first noun sense of ``word``, sorted.

    chlorine → (chemical_element, neon), (halogen, bromine), (gas, methane)...: every
    hyponym of every hypernym, other than the word's own synset.
    """
    syns = wn.synsets(word, "n")
    if not syns:
        return []
    own = syns[0]
    out = set()
    for hyper in own.hypernyms() + own.instance_hypernyms():
        for hypo in hyper.hyponyms() + hyper.instance_hyponyms():
            if hypo == own:
                continue
            name = _lemma_name(hypo)
            if name.lower() != word.lower():
                out.add((hyper.name(), name))
    return sorted(out)


def antonyms(wn: Any, word: str) -> list[str]:
    """Direct antonyms of the adjective ``word`` over all its senses, sorted (equal → unequal)."""
    out = set()
    for syn in wn.synsets(word, "a"):
        for lemma in syn.lemmas():
            if lemma.name().lower() == word.lower():
                out.update(a.name().replace("_", " ") for a in lemma.antonyms())
    return sorted(out)
