# Issue 25, claim 1 (Retrieve-from-CC §3.2, query expansion): expansion finds more domain data
# than the seed keywords alone. Included by mk/reproduce.mk (it uses VENV, BIN, CPTKIT, DATA,
# CORPUS and the seeds rule of the main Makefile).
#
# Sweep: expand.rounds 0 (the seed keywords alone), 1, 2, 3 x seed 0, 1, 2 (each member's every
# random choice: the LLM's sampling seed llm.seed=${seed} and the frontier sample), SmolLM2-135M
# (llm=auto: llama.cpp) at small settings. Every member then retrieves with the same top-k per
# query over $(CORPUS), and is scored against relevance labels fixed before any run
# (conf/reproduce/relevance_stem.yaml: where a document was published, not what the retriever
# said): the union of every query's top-k (the paper's protocol), and a fixed budget of
# EXP_BUDGET documents (taken round-robin by rank), the same for every member.
#   $(REPRO)/expansion/queries/rR_sS      expand-queries (one Hydra multirun writes them all)
#   $(REPRO)/expansion/retrieved/rR_sS    retrieve, and its _relevance.json
#   docs/reproductions_v1.md, claim 1     the report (make reproduce-v1; conf/reproduce/claims_v1.yaml)
# Resumes: a rerun redoes only what is missing. Finished multirun members are skipped by the step
# itself (same config and inputs: "already complete"); the LLM cache ($(EXP)/_llm_cache) also
# serves the first rounds of a member from the shorter members of its seed.
# Measured: the 12 members in 172 s wall (2:51) on 2 CPU cores shared with other work; a rerun
# after one member was deleted (and expansion/_SUCCESS with it) redid that member only, in 16 s.

DATA        ?= data
CORPUS      ?= $(DATA)/corpus
REPRO       ?= $(DATA)/repro
EXP         := $(REPRO)/expansion
EXP_ROUNDS  ?= 0 1 2 3
EXP_SEEDS   ?= 0 1 2
# llm.num_threads=1: llama.cpp's threads spin at every barrier; two of them on two cores busy with
# other work stalled here (no completion in 5 min), where one made 26 tokens/s.
EXP_ARGS    ?= expand.questions_per_seed=1 expand.max_frontier=4 llm.max_new_tokens=64 llm.num_threads=1
EXP_TOP_K   ?= 200
EXP_BUDGET  ?= 400
EXP_LABELS  ?= conf/reproduce/relevance_stem.yaml

EXP_MEMBERS := $(foreach r,$(EXP_ROUNDS),$(foreach s,$(EXP_SEEDS),r$(r)_s$(s)))
EXP_QUERIES := $(EXP_MEMBERS:%=$(EXP)/queries/%/_SUCCESS)
EXP_RETRIEVED := $(EXP_MEMBERS:%=$(EXP)/retrieved/%/_SUCCESS)
EXP_RELEVANCE := $(EXP_MEMBERS:%=$(EXP)/retrieved/%/_relevance.json)
EXP_CORPUS_DEP := $(if $(filter $(DATA)/corpus,$(CORPUS)),$(CORPUS)/_SUCCESS,$(wildcard $(CORPUS)/_SUCCESS))

.PHONY: reproduce-expansion
reproduce-expansion: $(EXP)/_SUCCESS

# The index every member searches: the demo's (its retrieved rule builds $(DATA)/index the same
# way); built here from the corpus, by retrieving the seeds, only where it is missing (retrieve
# itself refuses an index built from other corpus files).
$(DATA)/index/index.json: | $(EXP_CORPUS_DEP) $(DATA)/seeds.jsonl $(VENV)/.installed
	$(CPTKIT) retrieve --queries $(DATA)/seeds.jsonl --corpus $(CORPUS) --index $(@D) --out $(EXP)/_index_build -q

# One multirun writes every member (grouped target: the recipe runs once for all of them).
$(EXP_QUERIES) &: $(DATA)/seeds.jsonl | $(VENV)/.installed
	$(CPTKIT) expand-queries --in $(DATA)/seeds.jsonl --out '$(EXP)/queries/r{expand.rounds}_s{seed}' -q \
	    $(EXP_ARGS) 'llm.seed=$${seed}' llm.cache_dir=$(EXP)/_llm_cache hydra.sweep.dir=$(EXP)/_hydra \
	    -m expand.rounds=$(call csv,$(EXP_ROUNDS)) seed=$(call csv,$(EXP_SEEDS)) $(REPRO_LAUNCHER)

$(EXP)/retrieved/%/_SUCCESS: $(EXP)/queries/%/_SUCCESS $(EXP_CORPUS_DEP) | $(DATA)/index/index.json
	$(CPTKIT) retrieve --queries $(EXP)/queries/$* --corpus $(CORPUS) --index $(DATA)/index --out $(@D) \
	    retrieve.top_k=$(EXP_TOP_K) -q

# Precision and recall of every member (the corpus is read once for all of them).
$(EXP_RELEVANCE) &: $(EXP_RETRIEVED) $(EXP_LABELS)
	$(CPTKIT) retrieval-relevance $(foreach m,$(EXP_MEMBERS),--retrieved $(EXP)/retrieved/$(m)) \
	    --corpus $(CORPUS) --labels $(EXP_LABELS) --budget $(EXP_BUDGET)

$(EXP)/_SUCCESS: $(EXP_RELEVANCE)
	touch $@
