"""Causal language models as torch modules: loading (pretrained or tiny test models), tokenizers,
and scoring (losses, log-likelihoods). Text *generation* for steps lives in :mod:`cptkit.llm`."""
