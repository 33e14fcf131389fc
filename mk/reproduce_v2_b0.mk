# The v2 designs of conf/reproduce/claims.yaml that continue B0, the re-adapted SmolLM2 of the CPT
# section (Makefile: `make b0`, its probe, TRAIN_ARGS, EVAL_ARGS, the streams of each seed). Included by
# mk/reproduce.mk (V2, REPRO_V2_SEEDS and V2_SEED_LIST come from there). Members live under
# $(REPRO)/v2/<claim>/ and are read by cptkit.eval.reproduce with the claims' axes and seeds (their
# manifests' config: ratio and seed; arm and seed).
#   make reproduce-corruption-v2   claims corruption_low, corruption_high
#   make reproduce-replay-v2       claim replay
#   make reproduce-synthetic-v2    claim synthetic_share (a GPU's work: bench/gpu/reproduce.sh)
#   make reproduce-v2-b0           the first two sweeps and their report, $(REPRO)/v2/b0.md
# A seed redraws the held-out documents, the pairs, the corruption and the data order. Every
# member is a step output: a rerun skips the finished ones.
#
# Measured (2026-11-28, a clone's data/, B0 from the cache): corruption 29.2 min wall, 2,697 CPU-s (with the
# data steps and the probe); replay 59.7 min wall, 5,005 CPU-s (a third of it beside other work; ~46 min idle).
# The estimate made before either ran, kept for its per-process costs:
# Per process, the fixed cost measured at toy size (tiny Llama, CPU seconds, user + sys, 2026-11-28, on
# the loaded machine): pairs split 0.4 s, pairs make 0.4, corrupt 10.5 (spaCy + WordNet; ratio 0: 1.2),
# build-mix 1.3, train 12.9 (2 steps), margin 8.5 (10 pairs), evaluate 10.5 (imports, model). Scaled to
# SmolLM2 with its rates here (fp32: trains ~105 tokens/s, scores ~300 tokens/s) + ~3 s to load it and
# ~3 s to save it, spaCy at ~20k characters/s (assumed), a pair ~56 tokens (225 characters, toy pairs):
#   corruption, 5 seeds x 3 ratios
#     split 5 x 1.4 s + held-out corrupt 5 x (10.5 + 512k chars / 20k = 26) s + pairs 5 x 1 s   =   195 s
#     text corrupt 10 x (10.5 + 1.5) + 5 x 1.2 s + build-mix 15 x 2 s                             =   156 s
#     train 15 x (12.5 + 3 + 10 steps x 512 tokens / 105 = 48.8 + 3) s                             = 1,010 s
#     margin 15 x (8 + 3 + 200 pairs x 56 tokens / 300 = 37.3) s                                   =   725 s
#                                                                                         about 35 min
#   replay, 5 seeds x 6 arms
#     streams 25 x ~12 s (15 new, 10 the CPT section's stream_r0/stream_gen)                      =   300 s
#     train 25 x 67.3 s + tm0.2 5 x (67.3 - 2 steps x 4.9) s                                        = 1,970 s
#     evaluate 30 x (10.5 + 3 + (domain + probe: 2 x 64 docs x 64 tokens) / 300 = 27.3) s        = 1,230 s
#                                                                                         about 58 min
# Both: about 93 min. From a bare data/, add what they share with the CPT section: B0 (64 steps x 1,024
# tokens; 13.4 min measured beside the data steps, docs/cpt.md; cached by content), the probe (~2 min)
# and the data steps (~6 min): about 2 h in all, which leaves ~1 h of `make reproduce`'s 3 hours for
# expansion and the small-model sweeps. Under load, as here, each figure is several times longer.
# no forgetting curves in the sweeps' runs (the claims read the final evaluation only): 2 x 16 docs x
# 5 groups x 64 tokens of scoring saved per run; training itself is unchanged (evaluation draws nothing)
V2_TRAIN_OFF   ?= train.eval_every=0 'train.eval_extra=[]'

# --- corruption (Llama-3-SynE §5.2, Fig. 2, App. H) ------------------------------------------
# Per seed S: `cptkit.eval.pairs split` orders the domain (English records of $(DATA)/labelled with a
# topic: the CPT mix's domain) by a hash of (S, id): the first V2_HELDOUT_DOCS documents are held out,
# the next ones up to V2_TRAIN_CHARS characters are the training text. The held-out documents go through
# `cptkit corrupt` at V2_PAIR_RATIO with corrupt.seed=S, and V2_PAIRS sentence pairs (a sentence as
# written and with its edits) are drawn with S. The training text goes through `cptkit corrupt` at each
# ratio with corrupt.seed=S (a seed redraws the corruption), then build-mix (mix=corrupt_v2), then B0
# continues on it for V2_CORRUPT_STEPS steps, then the preference margin on the seed's pairs
# (cptkit.eval.margin): member $(V2)/corruption/cRATIO_sS.
V2_RATIOS        ?= 0.0 0.3 0.7
V2_CORRUPT_STEPS ?= $(CPT_STEPS)
V2_CORRUPT_TOKENS = $(shell echo $$(( $(V2_CORRUPT_STEPS) * $(STEP_TOKENS) )))  # STEP_TOKENS: the Makefile's
V2_TRAIN_CHARS    = $(shell echo $$(( $(V2_CORRUPT_TOKENS) * 6 )))  # ~4 characters a token, and to spare
V2_CORRUPT_MIX   ?= mix=corrupt_v2
V2_HELDOUT_DOCS  ?= 64
V2_PAIR_RATIO    ?= 0.5
V2_PAIRS         ?= 200
V2_MARGIN_ARGS   ?= --threads 2
V2_CORRUPT_ARGS  ?=  # e.g. corrupt.wordnet_dir=DIR (bench/gpu/reproduce.sh: a machine without /usr/share/wordnet)
V2C              := $(V2)/corruption_work

define v2_corruption_seed
$(V2C)/split_s$(1)/_split.json: $(DATA)/labelled/_SUCCESS | $(VENV)/.installed
	$(CPTKIT) pairs split --in $(DATA)/labelled --out $$(@D) --seed $(1) \
	    --heldout-docs $(V2_HELDOUT_DOCS) --train-chars $$(V2_TRAIN_CHARS)
$(V2C)/heldout_c_s$(1)/_SUCCESS: $(V2C)/split_s$(1)/_split.json
	$(CPTKIT) corrupt --in $(V2C)/split_s$(1)/heldout.jsonl --out $$(@D) corrupt.ratio=$(V2_PAIR_RATIO) corrupt.seed=$(1) \
	    $(V2_CORRUPT_ARGS) -q
$(V2C)/pairs_s$(1).jsonl: $(V2C)/heldout_c_s$(1)/_SUCCESS
	$(CPTKIT) pairs make --clean $(V2C)/split_s$(1)/heldout.jsonl --corrupted $$(<D) \
	    --out $$@ --n $(V2_PAIRS) --seed $(1)
endef

define v2_corruption_member
$(V2C)/text_c$(1)_s$(2)/_SUCCESS: $(V2C)/split_s$(2)/_split.json
	$(CPTKIT) corrupt --in $(V2C)/split_s$(2)/train.jsonl --out $$(@D) corrupt.ratio=$(1) corrupt.seed=$(2) \
	    $(V2_CORRUPT_ARGS) -q
$(V2C)/stream_c$(1)_s$(2)/_SUCCESS: $(V2C)/text_c$(1)_s$(2)/_SUCCESS
	$(CPTKIT) build-mix --in $$(<D) --out $$(@D) $(V2_CORRUPT_MIX) mix.budget_tokens=$$(V2_CORRUPT_TOKENS) \
	    tokenizer=$(TOKENIZER) seed=$(2) -q
$(V2C)/runs/c$(1)_s$(2)/_SUCCESS: $(V2C)/stream_c$(1)_s$(2)/_SUCCESS $(XP)/b0.json
	$(TRAIN) --in $$(<D) --out $$(@D) seed=$(2) train.max_steps=$(V2_CORRUPT_STEPS) train.mixture=staged \
	    $(V2_TRAIN_OFF) -q
$(V2)/corruption/c$(1)_s$(2)/_SUCCESS: $(V2C)/runs/c$(1)_s$(2)/_SUCCESS $(V2C)/pairs_s$(2).jsonl
	$(CPTKIT) margin --model $(V2C)/runs/c$(1)_s$(2)/model --pairs $(V2C)/pairs_s$(2).jsonl \
	    --out $$(@D) --meta ratio=$(1) --meta seed=$(2) $(V2_MARGIN_ARGS)
endef

$(foreach s,$(V2_SEED_LIST),$(eval $(call v2_corruption_seed,$(s))))
$(foreach r,$(V2_RATIOS),$(foreach s,$(V2_SEED_LIST),$(eval $(call v2_corruption_member,$(r),$(s)))))
V2_CORRUPTION := $(foreach r,$(V2_RATIOS),$(foreach s,$(V2_SEED_LIST),$(V2)/corruption/c$(r)_s$(s)/_SUCCESS))

# --- replay (Llama-3-SynE §4; Velocitune §4) -------------------------------------------------
# Arms, each B0 continued with the CPT section's $(TRAIN) (TRAIN_ARGS) on seed S's streams:
#   rp0.0         the no-replay stream ($(XP)/stream_r0_sS), CPT_STEPS steps
#   rp0.1 .. 0.3  the same mix (MIX) with general English replayed at that share, CPT_STEPS steps
#   tm0.2         the no-replay mix planned for round(0.8 x CPT_STEPS) steps: rp0.2's domain and Chinese
#                 sequences, fewer steps
#   neutral       general English only ($(XP)/stream_gen_sS), CPT_STEPS steps
# Every stream is planned for exactly the steps its arm trains (mix.budget_tokens = steps x STEP_TOKENS),
# so each arm trains on its nominal shares, not on the first steps of a larger plan interleaved at random.
# Member $(V2)/replay/ARM_sS: cptkit evaluate (EVAL_ARGS without the task) of the arm on seed S's
# held-out sample and the probe (texts B0 wrote), labelled arm=ARM seed=S. Only the groups the claim
# reads are scored (V2_REPLAY_GROUPS: the held-out domain and the probe; zh and general would double it).
V2_SHARES   ?= 0.1 0.2 0.3
V2_TM_STEPS  = $(shell awk 'BEGIN { printf "%d", $(CPT_STEPS) * 0.8 + 0.5 }')
V2_ARMS     ?= rp0.0 $(addprefix rp,$(V2_SHARES)) tm0.2 neutral
V2R         := $(V2)/replay_work
V2_EVAL     ?= $(EVAL_ARGS) eval.tasks=[]
V2_REPLAY_GROUPS ?= 'eval.ppl.groups=[domain,probe]'
v2_stream    = $(if $(filter rp0.0,$(1)),$(XP)/stream_r0_s$(2),$(if $(filter neutral,$(1)),$(XP)/stream_gen_s$(2),$(V2R)/streams/$(1)_s$(2)))
v2_steps     = $(if $(filter tm0.2,$(1)),$(V2_TM_STEPS),$(CPT_STEPS))
# Four arms are runs the CPT section makes too (the Makefile's noreplay, neutral and, at REPLAY=0.2,
# replay and noreplay_tm): the same stream, seed and steps, so the same weights (its forgetting curves
# draw nothing). A finished CPT member (`make cpt-experiment` first) is evaluated instead of trained
# again: 20 of the sweep's 30 runs. Without it the sweep trains its own, as below.
v2_cpt_arm   = $(if $(filter rp0.0,$(1)),noreplay,$(if $(filter neutral,$(1)),neutral,$(if $(filter 0.2,$(REPLAY)),$(if \
               $(filter rp0.2,$(1)),replay,$(if $(filter tm0.2,$(1)),noreplay_tm)))))
v2_run       = $(or $(if $(call v2_cpt_arm,$(1)),$(patsubst %/_SUCCESS,%,$(wildcard \
               $(XP)/runs/$(call v2_cpt_arm,$(1))_s$(2)/_SUCCESS))),$(V2R)/runs/$(1)_s$(2))

# $(1) arm, $(2) seed, $(3) replay share, $(4) steps: MIX planned for exactly the arm's steps
define v2_replay_stream
$(V2R)/streams/$(1)_s$(2)/_SUCCESS: $(DATA)/labelled/_SUCCESS $(CORPUS_DEP) | $(VENV)/.installed
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(CORPUS) --out $$(@D) $(MIX) tokenizer=$(TOKENIZER) seed=$(2) \
	    mix.budget_tokens=$$(shell echo $$$$(( $(4) * $$(STEP_TOKENS) ))) mix.replay.share=$(3) -q
endef

define v2_replay_member
$(V2R)/runs/$(1)_s$(2)/_SUCCESS: $(call v2_stream,$(1),$(2))/_SUCCESS $(XP)/b0.json
	$(TRAIN) --in $(call v2_stream,$(1),$(2)) --out $$(@D) seed=$(2) train.max_steps=$$(call v2_steps,$(1)) \
	    train.mixture=staged $(V2_TRAIN_OFF) -q
$(V2)/replay/$(1)_s$(2)/_SUCCESS: $(call v2_run,$(1),$(2))/_SUCCESS $(XP)/stream_r0_s$(2)/_SUCCESS $(XP)/probe.jsonl
	$(CPTKIT) evaluate --model $(call v2_run,$(1),$(2))/model --in $(XP)/stream_r0_s$(2)/_eval.jsonl.gz \
	    --in $(XP)/probe.jsonl --out $$(@D) $(V2_EVAL) $(V2_REPLAY_GROUPS) arm=$(1) seed=$(2) -q
endef

$(foreach s,$(V2_SEED_LIST),$(foreach x,$(V2_SHARES),$(eval $(call v2_replay_stream,rp$(x),$(s),$(x),$(CPT_STEPS)))) \
  $(eval $(call v2_replay_stream,tm0.2,$(s),0,$(V2_TM_STEPS))))
$(foreach a,$(V2_ARMS),$(foreach s,$(V2_SEED_LIST),$(eval $(call v2_replay_member,$(a),$(s)))))
V2_REPLAY := $(foreach a,$(V2_ARMS),$(foreach s,$(V2_SEED_LIST),$(V2)/replay/$(a)_s$(s)/_SUCCESS))

# --- synthetic share (Llama-3-SynE App. G, Fig. 6): not testable on 2 CPU cores, run by bench/gpu/reproduce.sh
# Per seed S: `cptkit.eval.pairs split` holds out V2_SYN_HELDOUT of the seed problems ($(DATA)/champ.jsonl)
# by a hash of (S, id); SmolLM2 writes V2_SYN_QA QA pairs (synthesize-qa, code mode, seed=S) from the
# others, the training QA, and V2_SYN_EVAL_QA from the held-out ones, whose solutions are the `answers`
# group (cptkit.eval.qa_heldout). Arms (mix=synthetic_v2): synS, the QA at share S of the stream, and
# real0.2, domain text in its place; B0 continued for CPT_STEPS steps; member $(V2)/synthetic_share/ARM_sS:
# cptkit evaluate on the answers and the probe, labelled arm=ARM seed=S.
V2_SYN_ARMS     ?= syn0.0 syn0.1 syn0.2 syn0.4 real0.2
V2_SYN_HELDOUT  ?= 40
V2_SYN_QA       ?= 400
V2_SYN_MIN_QA   ?= 0  # synthesize-qa fails when it keeps fewer training QA pairs (the GPU run: 400 a seed)
V2_SYN_EVAL_QA  ?= 100
V2_SYN_ARGS     ?= $(SYNTH_ARGS)
V2_SYN_MIX      ?= mix=synthetic_v2
V2S             := $(V2)/synthetic_work
v2_syn_weights   = $(if $(filter real0.2,$(1)),{domain:0.84$(comma)zh:0.16},$(shell awk 'BEGIN { x = $(patsubst syn%,%,$(1)); \
                     s = (x > 0) ? "synthetic:" x "," : ""; printf "{%sdomain:%g,zh:%g}", s, 0.8 * (1 - x), 0.2 * (1 - x) }'))

define v2_synthetic_seed
$(V2S)/split_s$(1)/_split.json: $(DATA)/champ.jsonl | $(VENV)/.installed
	$(CPTKIT) pairs split --in $(DATA)/champ.jsonl --out $$(@D) --seed $(1) --lang '' --require '' \
	    --heldout-docs $(V2_SYN_HELDOUT) --train-chars 0
$(V2S)/qa_s$(1)/_SUCCESS: $(V2S)/split_s$(1)/_split.json
	$(CPTKIT) synthesize-qa --in $(V2S)/split_s$(1)/train.jsonl --out $$(@D) $(V2_SYN_ARGS) \
	    synth.code.num_problems=$(V2_SYN_QA) synth.min_records=$(V2_SYN_MIN_QA) seed=$(1) $(LLM) -q
$(V2S)/qa_heldout_s$(1)/_SUCCESS: $(V2S)/split_s$(1)/_split.json
	$(CPTKIT) synthesize-qa --in $(V2S)/split_s$(1)/heldout.jsonl --out $$(@D) $(V2_SYN_ARGS) \
	    synth.code.num_problems=$(V2_SYN_EVAL_QA) seed=$(1) $(LLM) -q
$(V2S)/answers_s$(1).jsonl: $(V2S)/qa_heldout_s$(1)/_SUCCESS
	$(CPTKIT) qa-heldout --in $$(<D) --out $$@
endef

define v2_synthetic_member
$(V2S)/streams/$(1)_s$(2)/_SUCCESS: $(V2S)/qa_s$(2)/_SUCCESS $(DATA)/labelled/_SUCCESS $(CORPUS_DEP)
	$(CPTKIT) build-mix --in $(V2S)/qa_s$(2) --in $(DATA)/labelled --in $(CORPUS) --out $$(@D) $(V2_SYN_MIX) \
	    mix.budget_tokens=$$(ARM_TOKENS) \
	    'mix.stages=[{name:cpt,weights:$(V2_W_$(1))}]' tokenizer=$(TOKENIZER) seed=$(2) -q
$(V2S)/runs/$(1)_s$(2)/_SUCCESS: $(V2S)/streams/$(1)_s$(2)/_SUCCESS $(XP)/b0.json
	$(TRAIN) --in $$(<D) --out $$(@D) seed=$(2) train.max_steps=$(CPT_STEPS) train.mixture=staged $(V2_TRAIN_OFF) -q
$(V2)/synthetic_share/$(1)_s$(2)/_SUCCESS: $(V2S)/runs/$(1)_s$(2)/_SUCCESS $(V2S)/answers_s$(2).jsonl $(XP)/probe.jsonl
	$(CPTKIT) evaluate --model $(V2S)/runs/$(1)_s$(2)/model --in $(V2S)/answers_s$(2).jsonl --in $(XP)/probe.jsonl \
	    --out $$(@D) $(V2_EVAL) arm=$(1) seed=$(2) -q
endef

$(foreach s,$(V2_SEED_LIST),$(eval $(call v2_synthetic_seed,$(s))))
$(foreach a,$(V2_SYN_ARMS),$(eval V2_W_$(a) := $(call v2_syn_weights,$(a))))  # one awk per arm
$(foreach a,$(V2_SYN_ARMS),$(foreach s,$(V2_SEED_LIST),$(eval $(call v2_synthetic_member,$(a),$(s)))))
V2_SYNTHETIC := $(foreach a,$(V2_SYN_ARMS),$(foreach s,$(V2_SEED_LIST),$(V2)/synthetic_share/$(a)_s$(s)/_SUCCESS))

.PHONY: reproduce-corruption-v2 reproduce-replay-v2 reproduce-synthetic-v2 reproduce-v2-b0
reproduce-corruption-v2: $(V2_CORRUPTION)
reproduce-replay-v2: $(V2_REPLAY)
reproduce-synthetic-v2: $(V2_SYNTHETIC)
reproduce-v2-b0: $(V2)/b0.md
	@cat $<
# the report of every claim whose members exist (the others: "not run yet"); Holm over the primaries measured
$(V2)/b0.md: $(V2_CORRUPTION) $(V2_REPLAY) conf/reproduce/claims.yaml
	$(CPTKIT) reproduce-report conf/reproduce/claims.yaml --root $(REPRO) --out $@ --partial
