"""``python -m cptkit``: the same command line as ``cptkit``."""

from cptkit.cli import main

if __name__ == "__main__":
    main()
