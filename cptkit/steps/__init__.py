"""One module per step, each declaring itself with :func:`cptkit.core.step.step`.

The step ``name`` lives in ``cptkit/steps/<name with - as _>.py``. The framework finds, lists and
runs the steps from here by name (:mod:`cptkit.core.discovery`); this package holds only the steps.
"""
