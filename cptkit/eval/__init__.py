"""Evaluation: benchmark tasks as data (``tasks``: the task file; ``task_data``: fetching its
documents; ``templates``; ``fewshot``: prompts; ``answers``: extraction and matching; ``runner``:
scoring a task on a model), contamination, comparison.

The model-facing numbers (losses, log-likelihoods, generation) come from :mod:`cptkit.models.scoring`.
"""
