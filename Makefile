# One-command set-up, training and tests. Every target installs what it needs
# into .venv first; a second run finds everything in place and takes seconds.
#
#   make train        the main job: 2-worker horovodrun training with MergeComp
#   make test         the test suite
#   make build        rebuild the custom-op library after editing custom_ops/
#   make setup TF_PACKAGE=tensorflow==2.15.1   on a GPU host (CUDA TensorFlow)

PYTHON_BOOTSTRAP ?= python3
TF_PACKAGE ?= tensorflow-cpu==2.15.1
HOROVOD_VERSION ?= 0.28.1
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
NP ?= 2

# Horovod compiles against the TensorFlow already installed; CMake 4 breaks
# Gloo's build, so prefer the system CMake (see README, "The stack").
HOROVOD_ENV := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
	MAKEFLAGS=-j$$(nproc) PATH=/usr/bin:$$PATH

.PHONY: setup build train test bench clean

setup: $(VENV)/.stamp-project

$(VENV)/.stamp-python:
	$(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel
	touch $@

$(VENV)/.stamp-stack: $(VENV)/.stamp-python Makefile
	$(PIP) install --quiet "$(TF_PACKAGE)" "numpy<2" pytest scikit-learn matplotlib
	@command -v cmake >/dev/null || { echo "cmake (< 4) is required to build Horovod: apt-get install cmake"; exit 1; }
	$(HOROVOD_ENV) $(PIP) install --no-build-isolation "horovod==$(HOROVOD_VERSION)"
	$(VENV)/bin/horovodrun --check-build
	touch $@

$(VENV)/.stamp-project: $(VENV)/.stamp-stack setup.py
	$(PIP) install --quiet --no-build-isolation --no-deps -e .
	touch $@

build: $(VENV)/.stamp-stack
	$(PY) setup.py --quiet build_ext --inplace

train: setup build
	$(VENV)/bin/horovodrun -np $(NP) --gloo $(PY) examples/train_digits.py

test: setup build
	$(PY) -m pytest tests -q

bench: setup build
	$(PY) -m tf_mergecomp.bench ops

clean:
	rm -rf build tf_mergecomp/_mergecomp_ops*.so tf_mergecomp/_mergecomp_ops_build.json
