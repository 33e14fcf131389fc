"""Evaluation: benchmark tasks as data (``tasks``), answer extraction, contamination, comparison.

The model-facing numbers (losses, log-likelihoods, generation) come from :mod:`cptkit.models.lm`.
"""
