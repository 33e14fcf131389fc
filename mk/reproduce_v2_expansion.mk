# Issue "The papers' ablations v2", claim 1 (conf/reproduce/claims.yaml, id expansion; Retrieve-from-CC
# §3.2): does LLM query expansion find more of a topic's documents than pseudo-relevance feedback
# with as many queries? Included by mk/reproduce.mk after mk/reproduce_expansion.mk (it uses VENV,
# BIN, CPTKIT, DATA, CORPUS, REPRO, comma, that file's index rule and EXP_CORPUS_DEP).
#
# Replicates: the 32 topic keywords of conf/reproduce/topics_v2.yaml (each with a relevant set fixed
# before any run: a chapter of the Python or Maxima manual). Per keyword, three members, each a
# `cptkit retrieve` output over $(CORPUS) with top-k = the budget, scored by recall of the first
# V2E_BUDGET documents taken round-robin by rank (retrieval_relevance --budget):
#   round0  the keyword alone
#   round1  SmolLM2-135M's expansion of it (cptkit expand-queries, expand.rounds=1: the keyword, one
#           question, its answer and chain of thought; llm=auto, llama.cpp, one thread)
#   rm3     the keyword and, for every other round-1 query, one BM25 + RM3 query (Anserini's 10 feedback
#           documents, 10 terms, original query weight 0.5; query j takes the j-th 10 terms of the
#           relevance model): as many queries as round 1 (cptkit.eval.expansion_arms)
# Every random choice comes from V2E_SEED (expand-queries' seed and llm.seed; RM3 draws nothing).
#   $(V2W)/seeds.jsonl, round1/, queries/    the keyword seeds, the expansion, the three query sets per keyword
#   $(V2E)/method=M,keyword=SLUG/            the members (the claim's `v2/expansion/*`; the aggregator reads
#                                            method and keyword from the name) and their _relevance.json
#   $(REPRO)/v2/report_expansion.md          the claim decided (cptkit.eval.reproduce --partial)
# Resumes: each member is a make target (its _SUCCESS), so a rerun retrieves only what is missing;
# the LLM cache ($(V2W)/_llm_cache) serves a killed expansion's finished generations.

V2E          := $(REPRO)/v2/expansion
V2W          := $(REPRO)/v2/expansion_work
V2E_TOPICS   ?= conf/reproduce/topics_v2.yaml
V2E_SEED     ?= 0
V2E_ARGS     ?= expand.rounds=1 expand.questions_per_seed=1 expand.max_frontier=0 llm.max_new_tokens=64 llm.num_threads=1
V2E_RM3      ?= --fb-docs 10 --fb-terms 10 --original-query-weight 0.5
V2E_BUDGET   ?= 400
V2E_TOP_K    ?= $(V2E_BUDGET)
V2E_METHODS  := round0 round1 rm3
# The keywords' slugs, as cptkit.eval.retrieval_relevance.slug makes them (tests/test_reproduce_expansion_v2.py
# checks the two agree on the topics file).
V2E_SLUGS    := $(shell sed -n 's/^  - keyword: *//p' $(V2E_TOPICS) | tr 'A-Z' 'a-z' | sed 's/[^a-z0-9][^a-z0-9]*/-/g; s/^-//; s/-$$//')
v2e_eq       := =
V2E_MEMBERS  := $(foreach m,$(V2E_METHODS),$(foreach s,$(V2E_SLUGS),method$(v2e_eq)$(m)$(comma)keyword$(v2e_eq)$(s)))
V2E_RETRIEVED := $(V2E_MEMBERS:%=$(V2E)/%/_SUCCESS)
V2E_RELEVANCE := $(V2E_MEMBERS:%=$(V2E)/%/_relevance.json)

.PHONY: reproduce-expansion-v2
reproduce-expansion-v2: $(REPRO)/v2/report_expansion.md

$(V2W)/seeds.jsonl: $(V2E_TOPICS) | $(VENV)/.installed
	$(CPTKIT) expansion-arms seeds --topics $< --out $@

$(V2W)/round1/_SUCCESS: $(V2W)/seeds.jsonl
	$(CPTKIT) expand-queries --in $< --out $(@D) $(V2E_ARGS) seed=$(V2E_SEED) llm.seed=$(V2E_SEED) \
	    llm.cache_dir=$(V2W)/_llm_cache -q

$(V2W)/queries/_SUCCESS: $(V2W)/round1/_SUCCESS $(V2E_TOPICS) | $(DATA)/index/index.json
	$(CPTKIT) expansion-arms queries --topics $(V2E_TOPICS) --round1 $(V2W)/round1 \
	    --index $(DATA)/index --out $(@D) $(V2E_RM3)

$(V2E)/method$(v2e_eq)%/_SUCCESS: $(V2W)/queries/_SUCCESS $(EXP_CORPUS_DEP) | $(DATA)/index/index.json
	$(CPTKIT) retrieve --queries '$(V2W)/queries/method=$*.jsonl' --corpus $(CORPUS) --index $(DATA)/index \
	    --out '$(@D)' retrieve.top_k=$(V2E_TOP_K) -q

# Recall at the budget of every member against its keyword's relevant set (the corpus is read once).
$(V2E_RELEVANCE) &: $(V2E_RETRIEVED) $(V2E_TOPICS)
	$(CPTKIT) retrieval-relevance --corpus $(CORPUS) --topics $(V2E_TOPICS) --budget $(V2E_BUDGET) \
	    $(foreach m,$(V2E_MEMBERS),--retrieved '$(V2E)/$(m)' --topic $(lastword $(subst $(v2e_eq), ,$(m))))

$(REPRO)/v2/report_expansion.md: $(V2E_RELEVANCE) conf/reproduce/claims.yaml
	$(CPTKIT) reproduce-report conf/reproduce/claims.yaml --root $(REPRO) --out $@ --partial
