"""Classifier backends, one module each (:mod:`.fasttext`, :mod:`.minilm`, :mod:`.embed`,
:mod:`.ensemble`), behind the interface and registry of :mod:`.base`. Importing this package
registers the built-in ones; a backend of your own is named ``train.backend=package.module:Class``."""

from cptkit.labels.backends import embed, ensemble, fasttext, minilm  # noqa: F401  (each registers itself)
