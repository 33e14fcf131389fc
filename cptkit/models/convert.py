"""``cptkit convert-model SPEC``: make a model spec ready to load now (a GGUF is
dequantized once into ``$CPTKIT_CACHE/gguf``, :mod:`cptkit.models.gguf_cache`) and print the folder
it loads from. ``make demo`` runs it beside the data steps (``make base-model``), so that no later
step waits for the conversion."""

from __future__ import annotations

import sys
from pathlib import Path

from cptkit.core.errors import cli_main
from cptkit.models.lm import resolve_loadable


@cli_main
def main(argv: list[str] | None = None) -> int:
    """Convert ``SPEC`` (a ``.gguf`` file, a directory with one, or ``smollm2``) and print where it
    loads from; any other spec prints itself. A bad spec is a one-line error and exit status 2."""
    args = sys.argv[1:] if argv is None else argv
    usage = "usage: cptkit convert-model MODEL_SPEC"
    if args in (["-h"], ["--help"]):
        print(f"{usage}\n\n{__doc__}")
        return 0
    if len(args) != 1:
        print(usage, file=sys.stderr)
        return 2
    d, gguf = resolve_loadable(args[0])
    print(Path(d) / gguf if gguf else d)
    return 0
