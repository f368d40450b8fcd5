# The two set-up commands. Each installs what is missing first (idempotent; works on a fresh clone).
PY ?= python3

.PHONY: test demo deps gpu-check

deps:
	@PY=$(PY) bash tools/ensure_deps.sh

test: deps
	$(PY) -m pytest -q

demo: deps
	$(PY) -m minitriton.demo

# On the H200 machine (through the device tool): GPU tests and benchmarks in one call.
gpu-check:
	bash tools/gpu_check.sh
