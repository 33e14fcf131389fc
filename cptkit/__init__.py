"""cptkit: composable, reproducible steps for continual pre-training of LLMs."""

__version__ = "0.1.0"
