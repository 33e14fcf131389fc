# The v2 designs of three claims of conf/reproduce/claims.yaml (topic_ppl, velocitune, upsampling) on a
# small model that is not almost all embeddings. Included by mk/reproduce.mk (REPRO, REPRO_M, V2,
# REPRO_V2_SEEDS, V2_SEED_LIST, CPTKIT, comma and csv come from there and the Makefile).
#   make reproduce-topic_ppl-v2 reproduce-velocitune-v2 reproduce-upsampling-v2   (or reproduce-v2-small)
#
# v1's model (hidden 128, 2 layers) sat on SmolLM2's 49k vocabulary: 12.6M of its 13.1M parameters (96%)
# were the input and output embeddings. v2 learns an 8k byte-level BPE tokenizer from the corpus
# (cptkit train-tokenizer) and pre-trains from scratch a Llama of hidden 256, 4 layers, 4 heads, MLP 1024,
# input and output embeddings tied (as in SmolLM2): 6.29M parameters, of which the embedding matrix
# 8192 x 256 = 2.10M (33%) and the 4 blocks 4.19M (67%: 4 x (attention 4 x 256² + MLP 3 x 256 x 1024
# + norms)).
#
# Sizes, and the arithmetic of the time (an estimate, from toy-size timings, not a measured full run):
# one training step of 4 x 256 tokens took 0.72-0.78 s of CPU on one thread (cptkit train, this model,
# 8 steps, metrics.jsonl cpu_seconds); the forward pass of held-out scoring 0.22 ms of CPU per token.
# v1's model took 1.38 s of CPU per step on one thread here, and v1 states ~1,000 tokens/s (1.0 s per
# step) on 2 cores: 2 threads give ~1.4x, so a step is ~0.55 s and a scored token ~0.16 ms on 2 idle cores.
# Per seed, REPRO_V2_STEPS = S = 100 steps (102k tokens) a member, held-out scores on 64 documents x 128
# tokens per domain (6 domains: 49k tokens, ~8 s; upsampling's 4: 33k, ~5 s):
#   topic_ppl    S steps + 10 rounds' scores + the final one               55 + 88 s  (the first is cached)
#   static_avg   S steps + the final scores (the step-0 ones are cached)   55 +  8 s
#   proxy        0.6 S steps + 6 checkpoints' scores                       33 + 48 s
#   velocitune   S steps + 9 scores on 16 documents + the final ones       55 + 26 s
#   static_avg   S steps + the final scores                                55 +  8 s
#   upsampling   trunk 0.8 S, tail 0.2 S (+2 scores), uniform S and throughout S (+2, +1 scores)
#                = 3 S steps                                              165 + 25 s
#   2 streams (build-mix) and ~3 s of loading and saving per member        ~40 s
#   = ~660 s a seed, 5 seeds: ~55 min; the tokenizer (~10 s) and the base (400 steps: ~4 min) once;
#   ~10 processes starting torch (~5 s each): in all ~60 min on 2 idle cores. (One thread's CPU time, if
#   2 threads gave nothing: ~80 min.) REPRO_V2_STEPS and REPRO_V2_SEEDS scale it linearly.
# Measured (2026-11-28, a clean data/, beside the test suite): 124 min wall, 8,664 s of CPU (user + sys),
# i.e. ~76 min of 2 idle cores at ~1.9 cores busy; the base alone took 812 s of CPU (estimated ~330).
# A topic_ppl member took 2.1 min on an otherwise idle machine, as estimated.
# Every output is a step output keyed by its inputs and config (a rerun skips what is finished).

# steps of 4 x 256 tokens per member: a multiple of 10 (warmups, rounds and the tail are tenths of it)
REPRO_V2_STEPS      ?= 100
REPRO_V2_BASE_STEPS ?= 400
REPRO_V2_VOCAB      ?= 8192
# held-out documents per domain (drawn by each seed's stream), and Velocitune's subset S' of them for the
# velocities (§2.1; l_init on all of them)
REPRO_V2_EVAL_DOCS  ?= 64
REPRO_V2_VT_DOCS    ?= 16
REPRO_V2_THREADS    ?= 2
REPRO_V2_MODEL      ?= model=tiny_llama model.hidden=256 model.layers=4 model.heads=4 model.tie_embeddings=true

v2_calc       = $(shell echo $$(( $(1) )))
# a tenth of the steps: the warmup, a controller round, Velocitune's interval; the last fifth: upsampling's
# tail and every upsampling arm's decay
V2_ROUND     := $(call v2_calc,$(REPRO_V2_STEPS) / 10)
V2_TAIL      := $(call v2_calc,$(REPRO_V2_STEPS) / 5)
V2_TRUNK     := $(call v2_calc,$(REPRO_V2_STEPS) - $(V2_TAIL))
V2_MIX        = mix.budget_tokens=$(call v2_calc,$(1) * 1024) mix.eval_docs=$(REPRO_V2_EVAL_DOCS)
# $(1)_sSEED/_SUCCESS for every seed: a multirun's members
v2_members    = $(foreach s,$(V2_SEED_LIST),$(V2)/$(1)_s$(s)/_SUCCESS)

V2_BASE_ARGS ?= train.micro_batch=4 train.lr=3e-3 train.warmup=0.05 train.decay=0.25 train.min_lr_ratio=0.1 \
                train.threads=$(REPRO_V2_THREADS) train.precision=fp32 train.plot=false train.tensorboard=false
# Every member: the base continued, 4 x 256 tokens a step; held-out losses before step 1 and after the last
# (metrics.jsonl, eval_every) on REPRO_V2_EVAL_DOCS documents per domain, first 128 tokens of each.
V2_TRAIN     := model=hf model.path=$(V2)/base/model train.micro_batch=4 train.lr=1e-3 \
                train.threads=$(REPRO_V2_THREADS) train.precision=fp32 train.eval_docs=$(REPRO_V2_EVAL_DOCS) \
                train.eval_max_tokens=128 train.resume=true train.plot=false train.tensorboard=false
V2_CPT       := $(V2_TRAIN) train.max_steps=$(REPRO_V2_STEPS) train.warmup=$(V2_ROUND) \
                train.velocitune.init_eval_docs=$(REPRO_V2_EVAL_DOCS)
V2_CPT_EVAL  := $(V2_CPT) train.eval_every=$(REPRO_V2_STEPS)
V2_M          = -q -m seed=$(call csv,$(V2_SEED_LIST)) $(REPRO_M)

.PHONY: reproduce-v2-small reproduce-topic_ppl-v2 reproduce-velocitune-v2 reproduce-upsampling-v2
reproduce-v2-small: reproduce-topic_ppl-v2 reproduce-velocitune-v2 reproduce-upsampling-v2

# The tokenizer, learnt from the whole corpus slice, and the base: the upsampling sweep's main mix
# (mix=repro_v2_base), REPRO_V2_BASE_STEPS steps from scratch.
$(V2)/tokenizer/_SUCCESS: $(REPRO)/corpus/_SUCCESS
	$(CPTKIT) train-tokenizer --in $(REPRO)/corpus --out $(@D) tokenizer.vocab_size=$(REPRO_V2_VOCAB) -q
$(V2)/stream_base/_SUCCESS: $(V2)/tokenizer/_SUCCESS $(REPRO)/corpus/_SUCCESS
	$(CPTKIT) build-mix --in $(REPRO)/corpus --out $(@D) mix=repro_v2_base tokenizer=$(V2)/tokenizer \
	    mix.budget_tokens=$(call v2_calc,$(REPRO_V2_BASE_STEPS) * 1024) seed=0 -q
$(V2)/base/_SUCCESS: $(V2)/stream_base/_SUCCESS
	$(CPTKIT) train --in $(<D) --out $(@D) $(REPRO_V2_MODEL) $(V2_BASE_ARGS) train.max_steps=$(REPRO_V2_BASE_STEPS) \
	    seed=0 -q

# --- topic_ppl and velocitune: six domains (mix=repro_v2_topics), each arm against a static mixture at
# its own time-averaged weights (static_avg: the second run of a seed reads the first's avg_weights.json).
V2_TOPICS    := $(call v2_members,streams/topics)
V2_TP        := $(call v2_members,topic_ppl/topic_ppl)
V2_TP_AVG    := $(call v2_members,topic_ppl/static_avg)
V2_PROXY     := $(call v2_members,proxy/velocitune)
V2_VT        := $(call v2_members,velocitune/velocitune)
V2_VT_AVG    := $(call v2_members,velocitune/static_avg)
reproduce-topic_ppl-v2: $(V2_TP) $(V2_TP_AVG)
reproduce-velocitune-v2: $(V2_VT) $(V2_VT_AVG)

$(V2_TOPICS) &: $(V2)/tokenizer/_SUCCESS $(REPRO)/corpus/_SUCCESS
	$(CPTKIT) build-mix --in $(REPRO)/corpus --out '$(V2)/streams/topics_s{seed}' mix=repro_v2_topics \
	    tokenizer=$(V2)/tokenizer $(call V2_MIX,$(REPRO_V2_STEPS)) $(V2_M)

# SynE's controller: alpha 0.4, topics within each language, 10 rounds (9 adjustments).
$(V2_TP) $(V2_TP:_SUCCESS=avg_weights.json) &: $(V2_TOPICS) $(V2)/base/_SUCCESS
	$(CPTKIT) train --in '$(V2)/streams/topics_s{seed}' --out '$(V2)/topic_ppl/{train.mixture}_s{seed}' $(V2_CPT_EVAL) \
	    train.mixture=topic_ppl train.topic_ppl.round_fraction=0.1 $(V2_M)
$(V2_TP_AVG) &: $(V2_TP:_SUCCESS=avg_weights.json)
	$(CPTKIT) train --in '$(V2)/streams/topics_s{seed}' --out '$(V2)/topic_ppl/{train.mixture}_s{seed}' $(V2_CPT_EVAL) \
	    train.mixture=static_avg 'train.weights_from=$(V2)/topic_ppl/topic_ppl_s$${seed}/avg_weights.json' $(V2_M)

# Velocitune: a proxy per seed (token-share weights, 0.6 of the steps, a checkpoint every tenth) gives the
# targets; then 9 updates from uniform weights, velocities on REPRO_V2_VT_DOCS documents per domain.
$(V2_PROXY) $(V2_PROXY:_SUCCESS=_velocitune_targets.json) &: $(V2_TOPICS) $(V2)/base/_SUCCESS
	$(CPTKIT) train --in '$(V2)/streams/topics_s{seed}' --out '$(V2)/proxy/velocitune_s{seed}' \
	    $(V2_CPT) train.velocitune.proxy=true train.velocitune.proxy_every=0.1 $(V2_M)
$(V2_VT) $(V2_VT:_SUCCESS=avg_weights.json) &: $(V2_PROXY:_SUCCESS=_velocitune_targets.json)
	$(CPTKIT) train --in '$(V2)/streams/topics_s{seed}' --out '$(V2)/velocitune/{train.mixture}_s{seed}' $(V2_CPT_EVAL) \
	    train.mixture=velocitune train.velocitune.interval_steps=$(V2_ROUND) \
	    train.velocitune.eval_docs=$(REPRO_V2_VT_DOCS) train.velocitune.allow_unconverged=true \
	    'train.velocitune.targets_file=$(V2)/proxy/velocitune_s$${seed}/_velocitune_targets.json' $(V2_M)
$(V2_VT_AVG) &: $(V2_VT:_SUCCESS=avg_weights.json)
	$(CPTKIT) train --in '$(V2)/streams/topics_s{seed}' --out '$(V2)/velocitune/{train.mixture}_s{seed}' $(V2_CPT_EVAL) \
	    train.mixture=static_avg 'train.weights_from=$(V2)/velocitune/velocitune_s$${seed}/avg_weights.json' $(V2_M)

# --- upsampling: WSD branches on one stream per seed (mix=repro_v2_upsample: main, then the tail mix for
# the last 20%). Every arm has the same LR at every step: warmup, constant, a linear decay to 0 over the
# last 20%. The trunk (80%, constant LR, main mix) is shared by the tail0.2 arm, which branches off its
# last checkpoint (weights, AdamW state, data order); uniform and throughout are whole runs.
V2_DU        := $(call v2_members,streams/du)
V2_TRUNKS    := $(call v2_members,upsampling_trunk/trunk)
V2_UP_TAIL   := $(call v2_members,upsampling/tail0.2)
V2_UP_UNI    := $(call v2_members,upsampling/uniform)
V2_UP_ALL    := $(call v2_members,upsampling/throughout)
V2_UP         = --in '$(V2)/streams/du_s{seed}' --out '$(V2)/upsampling/{arm}_s{seed}' $(V2_TRAIN)
V2_WHOLE     := train.max_steps=$(REPRO_V2_STEPS) train.warmup=$(V2_ROUND) train.decay=$(V2_TAIL) \
                train.eval_every=$(REPRO_V2_STEPS)
reproduce-upsampling-v2: $(V2_UP_TAIL) $(V2_UP_UNI) $(V2_UP_ALL)

$(V2_DU) &: $(V2)/tokenizer/_SUCCESS $(REPRO)/corpus/_SUCCESS
	$(CPTKIT) build-mix --in $(REPRO)/corpus --out '$(V2)/streams/du_s{seed}' mix=repro_v2_upsample \
	    mix.tail_fraction=0.2 tokenizer=$(V2)/tokenizer $(call V2_MIX,$(REPRO_V2_STEPS)) $(V2_M)
$(V2_TRUNKS) &: $(V2_DU) $(V2)/base/_SUCCESS
	$(CPTKIT) train --in '$(V2)/streams/du_s{seed}' --out '$(V2)/upsampling_trunk/trunk_s{seed}' $(V2_TRAIN) \
	    train.max_steps=$(V2_TRUNK) train.warmup=$(V2_ROUND) train.eval_every=0 train.weights=stage:main $(V2_M)
$(V2_UP_TAIL) &: $(V2_TRUNKS)
	$(CPTKIT) train $(V2_UP) arm=tail0.2 train.weights=stage:tail train.max_steps=$(V2_TAIL) train.warmup=0 \
	    train.decay=$(V2_TAIL) train.eval_every=$(V2_TAIL) \
	    'train.branch_from=$(V2)/upsampling_trunk/trunk_s$${seed}' $(V2_M)
$(V2_UP_UNI) &: $(V2_DU) $(V2)/base/_SUCCESS
	$(CPTKIT) train $(V2_UP) arm=uniform train.weights=average $(V2_WHOLE) $(V2_M)
$(V2_UP_ALL) &: $(V2_DU) $(V2)/base/_SUCCESS
	$(CPTKIT) train $(V2_UP) arm=throughout train.weights=stage:tail $(V2_WHOLE) $(V2_M)

V2_SMALL_MEMBERS := $(V2_TP) $(V2_TP_AVG) $(V2_VT) $(V2_VT_AVG) $(V2_UP_TAIL) $(V2_UP_UNI) $(V2_UP_ALL)
