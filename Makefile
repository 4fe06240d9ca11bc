# lwm_jax: `make demo` and `make test` set everything up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
# glibc keeps large buffers mapped between steps instead of faulting them in afresh (+20-30% on CPU).
export MALLOC_MMAP_MAX_ ?= 0
export MALLOC_TRIM_THRESHOLD_ ?= 17179869184
export MALLOC_ARENA_MAX ?= 1

.PHONY: demo test test-slow test-tpu pods bench corpus more-worlds fixtures clean sandbox-tool reproduce world-model world-model-long

$(VENV)/.installed: setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# The terminal and swe environments run commands inside bubblewrap (lwm_jax/envs/sandbox.py):
# installed here when missing and we are root with apt, then checked to work on this kernel.
sandbox-tool: $(VENV)/.installed
	@command -v bwrap >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get install -y -qq bubblewrap || (apt-get update -qq && apt-get install -y -qq bubblewrap)) >/dev/null; \
	  else echo "bubblewrap (bwrap) is missing: install it (Debian/Ubuntu: apt-get install bubblewrap)" >&2; exit 1; fi; }
	@$(PY) -c 'import sys; from lwm_jax.envs import sandbox; p = sandbox.problem(); p and sys.exit(p + "; the terminal and swe environments need it (or LWM_ENVS_UNSAFE=1 to run them unisolated)")'

test: $(VENV)/.installed sandbox-tool
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -m "not slow" tests

# The expensive checks `make test` leaves out (several processes on loopback, every sharded mesh):
# a few minutes more; CI runs them after `make test`.
test-slow: $(VENV)/.installed sandbox-tool
	$(PY) -m pytest -q -p no:cacheprovider -n 2 --dist loadfile -m slow tests

# TPU programs compiled on this host (lwm_jax/compile.py, docs/pods.md): a separate environment
# with the `.[tpu]` extra (libtpu; it never enters $(VENV)), then the AOT compile tests. CI runs it
# after `make test`; a minute or two once the environment exists.
VENV_TPU ?= .venv-tpu
$(VENV_TPU)/.installed: setup.py
	test -x $(VENV_TPU)/bin/python || python3 -m venv $(VENV_TPU)
	$(VENV_TPU)/bin/python -m pip install -q -U pip
	$(VENV_TPU)/bin/python -m pip install -q -e '.[dev,tpu]'
	touch $@

test-tpu: $(VENV_TPU)/.installed
	$(VENV_TPU)/bin/python -m pytest -q -p no:cacheprovider -n 0 tests/test_compile_tpu.py

# The pod presets x stages table (benchmarks/results/pods.{md,json}); long: see docs/pods.md.
POD_PRESET ?= qwen3_30b_a3b
POD_TOPOLOGY ?= v5p:4x4x4
POD_STAGES ?= cpt
pods: $(VENV_TPU)/.installed
	$(VENV_TPU)/bin/python launch/compile.py --preset=$(POD_PRESET) --topology=$(POD_TOPOLOGY) --stages=$(POD_STAGES)

demo: $(VENV)/.installed sandbox-tool
	$(PY) launch/demo.py

# The recipe end to end with every stage evaluated free-running (docs/reproduce.md): sized for
# about 60 minutes on 2 CPU cores (1600 CPT steps: 51 minutes on idle cores on 2026-12-04; the
# runs are listed in docs/reproduce.md). BUDGET is a variant of configs/reproduce.py (tiny, full,
# ablation): `make reproduce BUDGET=tiny` is the few-minute smoke run; overrides of its fields
# (e.g. --config.ablations=masking) go in REPRODUCE_FLAGS. The report lands in runs/reproduce_$(BUDGET)/.
BUDGET ?= full
REPRODUCE_FLAGS ?=
reproduce: $(VENV)/.installed
	$(PY) launch/reproduce.py --config=configs/reproduce.py:$(BUDGET) --config.workdir=runs/reproduce_$(BUDGET) $(REPRODUCE_FLAGS)

# The shipped world model (data/world_model/, used by the demo's last part): the stages of
# configs/world_model.py run in order by launch/world_model.py, about 7 h 30 min on 2 idle cores.
# Five runs of the full reproduction (2000 CPT steps from scratch and 300 SFT steps, then four
# continuations, the last with 10,500 episodes of new worlds from `make more-worlds`), then a
# copying stage (about 2 h; each stage's measurements are linked from docs/world_model.md): terminal tour episodes with usual and made-up names,
# three listing-drill runs of the one trainer on a drill mixture (listing turns, ordinary SFT rows
# and synthetic copy rows: packed rows of 64, of 512, then far rows; the model learns to copy
# names from the initial state), then an 800-step CPT continuation with far copy rows in its
# batches and 300 SFT steps, shipped over data/world_model. One stage: `$(PY) launch/world_model.py
# --stages=cs1`; the plan: `--plan_only`. The shipped model has no time limit, and more CPT was
# the largest gain measured. Each shipped copy has its provenance.json (command, settings, corpus
# sha256, scores; each nests the one before).
world-model: $(VENV)/.installed more-worlds
	$(PY) launch/world_model.py --config=configs/world_model.py

# Its long-context companion (data/world_model_long/: 4,608 positions, so every bundled
# AgentWorldBench record fits): the recipe's CPT (400 steps) and SFT (300 steps) continued from
# data/world_model in rows of 4,608 tokens, configs/reproduce.py:long; about 50 minutes on 2 idle
# cores. It reads whole histories but scores a point lower on the same 140 test turns
# (docs/world_model.md), so the demo and the defaults keep data/world_model.
world-model-long: $(VENV)/.installed
	$(PY) launch/reproduce.py --config=configs/reproduce.py:long --config.workdir=runs/reproduce_long --config.ship=data/world_model_long

bench: $(VENV)/.installed
	$(PY) benchmarks/model_step.py

# Parity fixtures need the `hf` extra (torch CPU + transformers); never needed by `make test`.
fixtures: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[hf]'
	$(PY) tools/make_hf_fixtures.py

# Bundled corpus (7 domains x 300 real trajectories) and the mini benchmark; byte-identical on re-run.
corpus: $(VENV)/.installed sandbox-tool
	$(PY) tools/make_corpus.py --per_domain=300 --seed=0 --workers=2 --perturb_share=0.25

# More worlds for training the shipped world model: the corpus recipe with seed 1, 1500
# trajectories a domain (about 12.5 minutes), in runs/more_worlds/. Not bundled: regenerated on demand.
more-worlds: $(VENV)/.installed sandbox-tool
	$(PY) tools/make_corpus.py --per_domain=1500 --seed=1 --workers=2 --perturb_share=0.25 --corpus_dir=runs/more_worlds --bench_dir=runs/more_worlds_bench

clean:
	rm -rf $(VENV) *.egg-info
