"""One module per step; each exposes ``run(cfg) -> dict`` and registers its config schema."""
