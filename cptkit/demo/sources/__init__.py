"""The demo corpus sources, one module per Debian package parser; what they share is in
:mod:`.base`, the table of sources in :mod:`cptkit.demo.corpus`."""
