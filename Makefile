# lwm_jax: `make demo` and `make test` set everything up on a fresh machine.
VENV ?= .venv
PY := $(VENV)/bin/python
# glibc keeps large buffers mapped between steps instead of faulting them in afresh (+20-30% on CPU).
export MALLOC_MMAP_MAX_ ?= 0
export MALLOC_TRIM_THRESHOLD_ ?= 17179869184
export MALLOC_ARENA_MAX ?= 1

.PHONY: demo test bench corpus fixtures clean

$(VENV)/.installed: setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

test: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider tests

demo: $(VENV)/.installed
	$(PY) launch/demo.py

bench: $(VENV)/.installed
	$(PY) benchmarks/model_step.py

# Parity fixtures need the `hf` extra (torch CPU + transformers); never needed by `make test`.
fixtures: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[hf]'
	$(PY) tools/make_hf_fixtures.py

# Bundled corpus (7 domains x 300 real trajectories) and the mini benchmark; byte-identical on re-run.
corpus: $(VENV)/.installed
	$(PY) tools/make_corpus.py --per_domain=300 --seed=0 --workers=2

clean:
	rm -rf $(VENV) *.egg-info
