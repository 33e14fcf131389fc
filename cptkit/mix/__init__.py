"""Mixtures: recipes as pure functions (:mod:`.recipe`) and the stream format (:mod:`.stream`)."""
