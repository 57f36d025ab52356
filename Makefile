# weightsync — the two commands a newcomer needs:
#   make demo   builds and runs the two-process demo on shared memory
#   make test   builds and runs every test
# Both install missing Debian packages first (scripts/install_deps.sh).
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: all deps configure build cli test demo bench clean wheel

all: build

deps:
	@bash scripts/install_deps.sh

configure: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 600
	JOBS=$(JOBS) bash scripts/python_test.sh

# demo and bench build only the CLI (and the library it links), not the tests.
cli: configure
	@cmake --build $(BUILD) -j$(JOBS) --target weightsync_cli

demo: cli
	./$(BUILD)/weightsync demo $(DEMO_ARGS)

bench: cli
	./$(BUILD)/weightsync bench $(BENCH_ARGS)

clean:
	rm -rf $(BUILD)

# The portable wheel (docs/packaging.md): manylinux, GPU data plane in, xxHash and libcrypto
# static, into .whl/. PYTHONS="3.10 3.11 3.12 3.13" builds one per interpreter (default: python3).
wheel:
	JOBS=$(JOBS) bash scripts/build_wheel.sh

# Sanitizers, fuzzing and the whole CI pipeline (docs/ci.md):
#   make sanitize  test suite under ASan+UBSan (build-asan/), then under TSan (build-tsan/), each
#                  after canaries that must fail; sanitize-asan / sanitize-tsan run one of them
#   make fuzz      libFuzzer targets in fuzz/, FUZZ_SECONDS (default 30) each (build-fuzz/)
#   make ci        what CI runs (.ci/run): make test, make sanitize, a 20 s-per-target fuzz run
.PHONY: sanitize sanitize-asan sanitize-tsan fuzz ci
sanitize:
	JOBS=$(JOBS) bash scripts/ci_sanitizers.sh all

sanitize-asan:
	JOBS=$(JOBS) bash scripts/ci_sanitizers.sh asan

sanitize-tsan:
	JOBS=$(JOBS) bash scripts/ci_sanitizers.sh tsan

fuzz:
	JOBS=$(JOBS) bash scripts/fuzz.sh

ci:
	JOBS=$(JOBS) bash .ci/run
