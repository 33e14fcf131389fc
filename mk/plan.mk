# make plan-experiment: does `cptkit plan` predict anything? (docs/plan.md). Included by the Makefile.
# A grid of SmolLM2 runs from B0 (the CPT section's $(B0), $(MIX), $(STEP_TOKENS)): PLAN_REPLAY's five
# replay shares (domain shares ~1, 0.8, 0.6, 0.4, 0.2) x PLAN_SEEDS, PLAN_STEPS steps each with an eval
# point every PLAN_EVERY steps (8 after step 0). From the grid, `cptkit plan` writes the predicted domain
# and general losses, with 90% intervals, at PLAN_SCALE x the grid's tokens and the replay share PLAN_HELD
# (not in the grid): PLAN_PREREG, which must be committed before the held-out runs train (the targets
# below refuse while it is missing or uncommitted). Then the held-out runs, and `cptkit plan-check`
# scores the law against the last observed loss and a straight line in log-tokens.
#   make plan-predict      the grid and the prediction; copies it to PLAN_PREREG (kept if there)
#   make plan-experiment   the above, then (PLAN_PREREG committed) the held-out runs and the check:
#                          $(PX)/check/check.md
# Budget on 2 idle cores, from docs/cpt.md's rates (trains ~105 tokens/s, scores ~260 tokens/s):
#   training  10 grid runs x 56 x 512 = 286,720 tokens + 2 held-out x 224 x 512 = 229,376: 516,096 / 105 = 4,915 s
#   eval      (10 x 9 + 2 x 9) points x 3 groups x 16 docs x 64 tokens = 331,776 / 260 = 1,276 s
#   other     12 streams (~7 s each) + 12 model loads (~15 s) + the fits (~1 min): ~330 s
#   total     ~6,520 s: about 1 h 49 min (not yet measured: docs/plan.md); B0 and data/labelled are the CPT
#             section's, built once and not counted
PX           ?= $(XP)/plan
PLAN_REPLAY  ?= 0 0.2 0.4 0.6 0.8
PLAN_SEEDS   ?= 0 1
PLAN_STEPS   ?= 56
PLAN_EVERY   ?= 7
PLAN_HELD    ?= 0.3
PLAN_SCALE   ?= 4
PLAN_PREREG  ?= conf/plan/prediction.yaml
PLAN_FIT_ARGS ?= plan.bootstrap=200 plan.forgetting_measure=general
PLAN_TRAIN_ARGS ?= train.micro_batch=2 train.lr=1e-4 train.warmup=0.1 train.threads=2 train.precision=fp32 \
                   train.keep_checkpoints=false train.eval_docs=16 train.eval_max_tokens=64 train.mixture=staged
PLAN_TRAIN    = $(CPTKIT) train model=hf model.path=$(B0) $(PLAN_TRAIN_ARGS)
PLAN_TOKENS   = $(shell expr $(PLAN_STEPS) \* $(STEP_TOKENS))
PLAN_HSTEPS   = $(shell expr $(PLAN_STEPS) \* $(PLAN_SCALE))
PLAN_HTOKENS  = $(shell expr $(PLAN_HSTEPS) \* $(STEP_TOKENS))
PLAN_HRATIO   = $(shell awk 'BEGIN { printf "%g", 1 - $(PLAN_HELD) }')
PLAN_GRID    := $(foreach r,$(PLAN_REPLAY),$(foreach s,$(PLAN_SEEDS),$(PX)/grid/rp$(r)_s$(s)))
PLAN_HELDOUT := $(foreach s,$(PLAN_SEEDS),$(PX)/heldout/rp$(PLAN_HELD)_s$(s))
# a member's stem rpSHARE_sSEED: its replay share and seed
plan_share    = $(patsubst rp%,%,$(firstword $(subst _, ,$(1))))
plan_seed     = $(patsubst s%,%,$(lastword $(subst _, ,$(1))))

.PHONY: plan-predict plan-experiment plan-prereg-check

# each member its own stream (seed: its held-out sample and data order), planned for exactly its tokens
$(PX)/stream_%/_SUCCESS: $(DATA)/labelled/_SUCCESS $(CORPUS_DEP) | $(VENV)/.installed
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(CORPUS) --out $(@D) $(MIX) tokenizer=$(TOKENIZER) \
	    seed=$(call plan_seed,$*) mix.budget_tokens=$(PLAN_TOKENS) mix.replay.share=$(call plan_share,$*) -q
$(PX)/hstream_%/_SUCCESS: $(DATA)/labelled/_SUCCESS $(CORPUS_DEP) | $(VENV)/.installed
	$(CPTKIT) build-mix --in $(DATA)/labelled --in $(CORPUS) --out $(@D) $(MIX) tokenizer=$(TOKENIZER) \
	    seed=$(call plan_seed,$*) mix.budget_tokens=$(PLAN_HTOKENS) mix.replay.share=$(call plan_share,$*) -q
$(PX)/grid/%/_SUCCESS: $(PX)/stream_%/_SUCCESS $(XP)/b0.json
	$(PLAN_TRAIN) --in $(<D) --out $(@D) seed=$(call plan_seed,$*) train.max_steps=$(PLAN_STEPS) \
	    train.eval_every=$(PLAN_EVERY) -q
# the held-out runs: only once the prediction is committed; eval every PLAN_SCALE x PLAN_EVERY steps
$(PX)/heldout/%/_SUCCESS: $(PX)/hstream_%/_SUCCESS $(XP)/b0.json | plan-prereg-check
	$(PLAN_TRAIN) --in $(<D) --out $(@D) seed=$(call plan_seed,$*) train.max_steps=$(PLAN_HSTEPS) \
	    train.eval_every=$(shell expr $(PLAN_EVERY) \* $(PLAN_SCALE)) -q

$(PX)/fit/_SUCCESS: $(addsuffix /_SUCCESS,$(PLAN_GRID))
	$(CPTKIT) plan $(addprefix --in ,$(PLAN_GRID)) --out $(@D) plan.target_tokens=$(PLAN_HTOKENS) \
	    'plan.predict_ratios=[$(PLAN_HRATIO)]' $(PLAN_FIT_ARGS)
plan-predict: $(PX)/fit/_SUCCESS
	@if [ -f $(PLAN_PREREG) ]; then echo "$(PLAN_PREREG) exists: kept (the registered prediction)"; \
	else mkdir -p $(dir $(PLAN_PREREG)) && cp $(PX)/fit/prediction.yaml $(PLAN_PREREG) && \
	echo "wrote $(PLAN_PREREG): commit it (git add $(PLAN_PREREG); git commit), then make plan-experiment"; fi
plan-prereg-check:
	@test -f $(PLAN_PREREG) || { echo "$(PLAN_PREREG): missing: make plan-predict writes it" >&2; exit 2; }
	@git -C $(dir $(PLAN_PREREG)) ls-files --error-unmatch $(notdir $(PLAN_PREREG)) >/dev/null 2>&1 && \
	    git -C $(dir $(PLAN_PREREG)) diff --quiet HEAD -- $(notdir $(PLAN_PREREG)) || \
	    { echo "$(PLAN_PREREG): not committed: commit the prediction before the held-out runs train" >&2; exit 2; }

$(PX)/check/_SUCCESS: $(addsuffix /_SUCCESS,$(PLAN_HELDOUT)) | plan-prereg-check
	$(CPTKIT) plan-check $(addprefix --in ,$(PLAN_HELDOUT)) --out $(@D) plan_check.prediction=$(PLAN_PREREG) -q
plan-experiment: plan-predict | $(VENV)/.installed  # -o: make does not hand a caller's -o down
	@$(MAKE) --no-print-directory -o $(VENV)/.installed $(PX)/check/_SUCCESS
	@cat $(PX)/check/check.md
