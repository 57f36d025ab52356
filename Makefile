# weightsync — the two commands a newcomer needs:
#   make demo   builds and runs the two-process demo on shared memory
#   make test   builds and runs every test
# Both install missing Debian packages first (scripts/install_deps.sh).
BUILD ?= build
JOBS ?= 2
CMAKE_FLAGS ?=

.PHONY: all deps configure build test demo bench clean

all: build

deps:
	@bash scripts/install_deps.sh

configure: deps
	@cmake -S . -B $(BUILD) $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j$(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS) --timeout 600

demo: build
	./$(BUILD)/weightsync demo $(DEMO_ARGS)

bench: build
	./$(BUILD)/weightsync bench $(BENCH_ARGS)

clean:
	rm -rf $(BUILD)
