# One-command set-up, training and tests. Every target installs what it needs
# into the venv first; a second run finds everything in place and takes seconds.
#
#   make train        the main job: 2-worker horovodrun training with MergeComp, on
#                     TensorFlow 2.21 with Keras 3 (tf_mergecomp.keras); KERAS=2 runs it
#                     on Keras 2 (tf_keras) through Horovod's Keras wrappers
#   make test         the test suite
#   make test-quick   the suite without the tests that start Horovod ranks
#   make build        rebuild the custom-op library after editing custom_ops/ (one
#                     library per TensorFlow version: every venv here keeps working)
#   make setup TF_PACKAGE=tensorflow==2.15.1   on a GPU host (CUDA TensorFlow)
#   make gpu-build    here, no GPU needed: a CUDA TensorFlow and a CUDA 12 toolchain
#                     from PyPI in their own venv (.venv-gpu), the op library built
#                     with its GPU kernels (build/gpu-ops/), loaded, and TensorFlow's
#                     kernel registry checked for a GPU kernel of every group op and
#                     dtype (docs/gpu.md); one summary line
#   make gpu-check    on a GPU host with nvcc, CuPy, numpy and pytest (no TensorFlow,
#                     no venv): builds the CUDA launchers, checks them against the
#                     CPU ops' golden outputs and benchmarks the group codecs
#                     (docs/gpu.md); OUT=dir keeps the results
#   make gpu-emulate  here, no GPU, no venv (GPU_PYTHON with numpy and pytest): the same
#                     launcher checks on the CUDA emulation (gpu_check/emulation: the .cu.cc
#                     sources built by g++, kernels run on the CPU, one host thread per CUDA
#                     thread) and the emulation's self-test; `make test` runs them too
#   make gpu-emulate-sanitize   the emulated launcher checks under UBSan (alignment
#                     included) and then ThreadSanitizer, each finding printed with its
#                     test and source line (docs/gpu.md, "The CUDA emulation"); minutes,
#                     not part of `make test` or CI; fails while a sanitizer reports
#
# Another TensorFlow release (docs/stack.md): add TF_VERSION=2.15 ... 2.21 (a minor
# release, or a full version such as 2.18.0) to any target. It gets its own venv,
# .venv-tf<version>; the default (TensorFlow 2.21.0) lives in .venv. TensorFlow 2.15 is
# Keras 2 only; from 2.16 tf_keras is installed beside Keras 3, and the suite tests
# both. For 2.19 and later, Horovod 0.28.1's sdist is built with
# patches/horovod-0.28.1-tf2.19.patch applied (docs/stack.md, "The Horovod patch").
#
#   make test TF_VERSION=2.15        the suite on Keras 2 alone, as CI runs it
#   make train KERAS=2               the main job on Keras 2 (tf_keras)

PYTHON_BOOTSTRAP ?= python3
HOROVOD_VERSION ?= 0.28.1
NP ?= 2

DEFAULT_TF_VERSION := 2.21.0
TF_VERSION ?= $(DEFAULT_TF_VERSION)
# The release a minor version stands for: its newest patch release.
TF_RELEASE_2.15 := 2.15.1
TF_RELEASE_2.16 := 2.16.2
TF_RELEASE_2.17 := 2.17.1
TF_RELEASE_2.18 := 2.18.1
TF_RELEASE_2.19 := 2.19.1
TF_RELEASE_2.20 := 2.20.0
TF_RELEASE_2.21 := 2.21.0
SUPPORTED_TF_MINOR_VERSIONS := 2.15 2.16 2.17 2.18 2.19 2.20 2.21
TF_FULL_VERSION := $(or $(TF_RELEASE_$(TF_VERSION)),$(TF_VERSION))
TF_MINOR_VERSION := $(word 1,$(subst ., ,$(TF_FULL_VERSION))).$(word 2,$(subst ., ,$(TF_FULL_VERSION)))
TF_PACKAGE ?= tensorflow-cpu==$(TF_FULL_VERSION)
ifeq ($(filter $(TF_MINOR_VERSION),$(SUPPORTED_TF_MINOR_VERSIONS)),)
$(warning TensorFlow $(TF_FULL_VERSION) is outside the supported $(firstword $(SUPPORTED_TF_MINOR_VERSIONS)) to $(lastword $(SUPPORTED_TF_MINOR_VERSIONS)); trying anyway)
endif
# TensorFlow >= 2.16 ships Keras 3 as tf.keras: KERAS=3 (the default there) trains
# through tf_mergecomp.keras. KERAS=2 trains through Horovod's Keras wrappers on Keras 2,
# which TensorFlow <= 2.15 ships and later releases take from tf_keras (same minor
# version) with TF_USE_LEGACY_KERAS=1. tf_keras is installed with every TensorFlow >= 2.16,
# so the suite tests both Keras there (tests/conftest.py).
KERAS_PACKAGE := $(if $(filter 2.12 2.13 2.14 2.15,$(TF_MINOR_VERSION)),,tf-keras~=$(TF_MINOR_VERSION).0)
KERAS ?= $(if $(KERAS_PACKAGE),3,2)
ifeq ($(filter 2 3,$(KERAS)),)
$(error KERAS=$(KERAS): choose KERAS=3 (TensorFlow >= 2.16) or KERAS=2)
endif
ifeq ($(KERAS)$(KERAS_PACKAGE),3)
$(error KERAS=3 needs TensorFlow >= 2.16; TensorFlow $(TF_FULL_VERSION) ships Keras 2: use KERAS=2)
endif
ifeq ($(KERAS),2)
ifneq ($(KERAS_PACKAGE),)
export TF_USE_LEGACY_KERAS := 1
endif
TRAIN_SCRIPT := examples/train_digits.py
TRAIN_ENV :=
else
TRAIN_SCRIPT := examples/train_digits_keras3.py
TRAIN_ENV := env -u TF_USE_LEGACY_KERAS
endif

ifeq ($(TF_FULL_VERSION),$(DEFAULT_TF_VERSION))
VENV ?= .venv
else
VENV ?= .venv-tf$(TF_FULL_VERSION)
endif
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

# Horovod compiles against the TensorFlow already installed; CMake 4 breaks
# Gloo's build, so prefer the system CMake (docs/stack.md).
HOROVOD_ENV := HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
	MAKEFLAGS=-j$$(nproc) PATH=/usr/bin:$$PATH
# Horovod's wheel only works with the TensorFlow it was compiled against, which
# pip's own wheel cache does not tell apart: keep built wheels per TensorFlow
# package here (a second venv for the same TensorFlow then installs in seconds).
# Horovod 0.28.1 compiles against TensorFlow 2.19 and later only with this patch to its
# sdist (docs/stack.md, "The Horovod patch"); earlier releases build it unpatched.
# HOROVOD_PATCH= (empty) builds unpatched. A patched wheel is cached apart from an
# unpatched one, under the patch's hash, so editing the patch rebuilds it.
TF_MAJOR_MINOR_WORDS := $(subst ., ,$(TF_MINOR_VERSION))
HOROVOD_PATCH ?= $(if $(shell [ "$(word 1,$(TF_MAJOR_MINOR_WORDS))" = 2 ] && [ "$(word 2,$(TF_MAJOR_MINOR_WORDS))" -ge 19 ] 2>/dev/null && echo yes),$(CURDIR)/patches/horovod-$(HOROVOD_VERSION)-tf2.19.patch)
HOROVOD_PATCH_TAG := $(if $(HOROVOD_PATCH),-patch-$(shell sha256sum < $(HOROVOD_PATCH) | cut -c1-12))
HOROVOD_WHEELS ?= $(HOME)/.cache/tf_mergecomp/horovod-$(HOROVOD_VERSION)-$(subst ==,-,$(TF_PACKAGE))$(HOROVOD_PATCH_TAG)

.PHONY: setup build train test test-quick bench clean gpu-check gpu-build horovod-test \
	gpu-emulate gpu-emulate-sanitize

setup: $(VENV)/.stamp-project

$(VENV)/.stamp-python:
	$(PYTHON_BOOTSTRAP) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip setuptools wheel
	touch $@

$(VENV)/.stamp-stack: $(VENV)/.stamp-python Makefile $(HOROVOD_PATCH)
	@# tensorboard: tf.summary (the partition search's log_dir) needs it; TensorFlow 2.21 no
	@# longer depends on it, earlier releases pin their own.
	$(PIP) install --quiet "$(TF_PACKAGE)" $(if $(KERAS_PACKAGE),"$(KERAS_PACKAGE)") "numpy<2" tensorboard pytest scikit-learn matplotlib
	@command -v cmake >/dev/null || { echo "cmake (< 4) is required to build Horovod: apt-get install cmake"; exit 1; }
	@tag=$$($(PY) -c 'import sys; print("cp%d%d" % sys.version_info[:2])'); \
	wheel=$$(ls $(HOROVOD_WHEELS)/horovod-$(HOROVOD_VERSION)-$$tag-*.whl 2>/dev/null | head -n 1); \
	if [ -z "$$wheel" ]; then \
		echo "tf_mergecomp: building Horovod $(HOROVOD_VERSION) against $(TF_PACKAGE)$(if $(HOROVOD_PATCH), with $(notdir $(HOROVOD_PATCH))) (minutes)"; \
		source="horovod==$(HOROVOD_VERSION)"; \
		$(if $(HOROVOD_PATCH),src=$$(mktemp -d) && trap 'rm -rf "$$src"' EXIT && \
			$(PIP) download --quiet --no-deps --no-binary :all: --no-build-isolation \
				-d "$$src" "horovod==$(HOROVOD_VERSION)" && \
			tar -xzf "$$src/horovod-$(HOROVOD_VERSION).tar.gz" -C "$$src" && \
			patch -d "$$src/horovod-$(HOROVOD_VERSION)" -p1 --forward < "$(HOROVOD_PATCH)" || exit 1; \
			source="$$src/horovod-$(HOROVOD_VERSION)";) \
		$(HOROVOD_ENV) $(PIP) wheel --quiet --no-cache-dir --no-build-isolation --no-deps \
			-w $(HOROVOD_WHEELS) "$$source" || exit 1; \
		wheel=$$(ls $(HOROVOD_WHEELS)/horovod-$(HOROVOD_VERSION)-$$tag-*.whl | head -n 1); \
	fi; \
	echo "$(PIP) install --force-reinstall --no-deps $$wheel"; \
	$(PIP) install --quiet --force-reinstall --no-deps "$$wheel" && $(PIP) install --quiet "$$wheel"
	$(VENV)/bin/horovodrun --check-build
	touch $@

$(VENV)/.stamp-project: $(VENV)/.stamp-stack setup.py
	$(PIP) install --quiet --no-build-isolation --no-deps -e .
	touch $@

build: $(VENV)/.stamp-stack
	$(PY) setup.py --quiet build_ext --inplace

train: setup build
	$(TRAIN_ENV) $(VENV)/bin/horovodrun -np $(NP) --gloo $(PY) $(TRAIN_SCRIPT)

test: setup build
	$(PY) -m pytest tests -q

# The suite without the tests that start Horovod ranks (pytest -m "not multiworker").
test-quick: setup build
	$(PY) -m pytest tests -q -m "not multiworker"

bench: setup build
	$(PY) -m benchmarks ops

# Horovod's own TensorFlow tests that need no MPI and no GPU, over Gloo with NP ranks, on
# the Horovod this venv built (docs/stack.md, "Horovod's own tests"). HOROVOD_TESTS is
# Horovod's test/ directory at its release tag (git clone -b v0.28.1
# https://github.com/horovod/horovod; it is not part of the sdist); JUnit XML per rank and
# file goes to HOROVOD_TEST_OUT. The target fails if either file has a failure.
# HOROVOD_TEST_ARGS="-p tf_mergecomp" runs them with tf_mergecomp imported first (its
# Horovod hook and Keras-backend fix in place, as in the project's own runs).
HOROVOD_TESTS ?=
HOROVOD_TEST_ARGS ?=
HOROVOD_TEST_FILES ?= test_tensorflow.py test_tensorflow2_keras.py
HOROVOD_TEST_OUT ?= $(CURDIR)/build/horovod-tests-tf$(TF_FULL_VERSION)
horovod-test: setup build
	@[ -f "$(HOROVOD_TESTS)/parallel/test_tensorflow.py" ] || { echo "HOROVOD_TESTS=<Horovod's test/ directory, tag v$(HOROVOD_VERSION)> is required"; exit 1; }
	$(PIP) install --quiet mock parameterized
	mkdir -p $(HOROVOD_TEST_OUT)
	@status=0; cd $(HOROVOD_TESTS)/parallel && for f in $(HOROVOD_TEST_FILES); do \
		echo "== $$f"; \
		$(abspath $(VENV))/bin/horovodrun -np $(NP) -H localhost:$(NP) --gloo sh -c \
			'exec $(abspath $(PY)) -m pytest -v -p no:cacheprovider $(HOROVOD_TEST_ARGS) --junit-xml=$(HOROVOD_TEST_OUT)/$${0%.py}.rank$$HOROVOD_RANK.xml "$$0"' $$f \
			> $(HOROVOD_TEST_OUT)/$${f%.py}.log 2>&1 || status=1; \
		grep -E "^\[[0-9]\]<stdout>:=+ .*(passed|failed|error).* in " $(HOROVOD_TEST_OUT)/$${f%.py}.log; \
	done; exit $$status

# Needs no venv and no TensorFlow: the system python3 (GPU_PYTHON) with CuPy.
# The benchmark runs even when a check fails; the target fails if either does.
GPU_PYTHON ?= python3
gpu-check:
	$(GPU_PYTHON) -m gpu_check.launchers
	@status=0; \
	$(GPU_PYTHON) -m pytest tests/test_cuda_launchers.py -q -p no:cacheprovider -rs \
		$(if $(OUT),--junitxml=$(OUT)/gpu_check_tests.xml) || status=$$?; \
	$(GPU_PYTHON) -m gpu_check.bench $(if $(OUT),--out $(OUT)) || status=$$?; \
	exit $$status

# The CUDA emulation (gpu_check/emulation, docs/gpu.md): g++ and GPU_PYTHON's numpy and
# pytest, no GPU, no venv.
gpu-emulate:
	MERGECOMP_LAUNCHER_BACKEND=emulated nice $(GPU_PYTHON) -m pytest tests/test_cuda_launchers.py \
		tests/test_cuda_emulation.py -q -p no:cacheprovider

gpu-emulate-sanitize:
	nice $(GPU_PYTHON) -m gpu_check.emulation.sanitize

# The CUDA wheel of the default TensorFlow and the CUDA 12 it was built with
# (12.2: headers, crt, libcudart.so.12), all from PyPI, never the machine's own
# CUDA. PyPI's CUDA 12 nvcc package holds ptxas and libnvvm but no nvcc driver:
# the .cu.cc sources compile with the nvcc of PyPI's CUDA 13 packages (GPU_NVCC_
# PACKAGES; docs/gpu.md). With a CUDA 12 toolkit installed: NVCC=/path/to/nvcc.
GPU_VENV ?= .venv-gpu
GPU_TF_PACKAGE ?= tensorflow==$(DEFAULT_TF_VERSION)
CUDA12_PACKAGE_VERSION ?= 12.2.140
GPU_CUDA_PACKAGES ?= nvidia-cuda-nvcc-cu12==$(CUDA12_PACKAGE_VERSION) \
	nvidia-cuda-runtime-cu12==$(CUDA12_PACKAGE_VERSION) nvidia-cuda-cccl-cu12==$(CUDA12_PACKAGE_VERSION)
GPU_NVCC_PACKAGES ?= nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
	nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85
GPU_PY := $(GPU_VENV)/bin/python

$(GPU_VENV)/.stamp-stack: Makefile
	$(PYTHON_BOOTSTRAP) -m venv $(GPU_VENV)
	$(GPU_PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(GPU_PY) -m pip install --quiet "$(GPU_TF_PACKAGE)" "numpy<2" pytest $(GPU_CUDA_PACKAGES) \
		$(if $(NVCC),,$(GPU_NVCC_PACKAGES))
	touch $@

gpu-build: $(GPU_VENV)/.stamp-stack
	nice $(GPU_PY) -m gpu_check.tf_build

clean:
	rm -rf build tf_mergecomp/_mergecomp_ops*.so tf_mergecomp/_mergecomp_ops*.json
