"""Causal language models as torch modules: loading models and tokenizers (:mod:`.lm`), what a
model computes on text (:mod:`.scoring`: losses, log-likelihoods, lm-eval's requests), tiny test
models (:mod:`.tiny`), GGUF export and conversion. Text *generation* for steps lives in
:mod:`cptkit.llm`."""
