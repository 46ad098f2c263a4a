# libskv's commands. `make test` is the one test command; `make sim` runs the main job.
PREFIX ?= /usr/local
CARGO ?= cargo

.PHONY: all build deps test test-rust test-c test-integration sim fuzz bench install header-check clean

all: build

build:
	$(CARGO) build --release

# Everything CI runs: Rust unit, property and smoke tests; the C suite plain, under
# AddressSanitizer and under valgrind; the installed-package consumers.
test: deps test-rust test-c test-integration

# cmake, pkg-config and valgrind (apt-get as root when missing).
deps:
	scripts/deps.sh

test-rust: | deps
	$(CARGO) test
	$(CARGO) test --benches
	$(CARGO) test --features cuda --test device -- --nocapture

test-c: build | deps
	ctests/run.sh target/release
	SKV_CTEST_SANITIZE=address ctests/run.sh target/release
	SKV_CTEST_VALGRIND=1 ctests/run.sh target/release

test-integration: build | deps
	ctests/integration.sh --no-build

sim:
	$(CARGO) run --release --bin skv-sim

# The long fuzz run (cargo test runs 100,000 calls); FUZZ_PROBES=all once the holes are closed.
FUZZ_CALLS ?= 10000000
FUZZ_SEED ?= 0x10c0ffee
fuzz:
	SKV_FUZZ_CALLS=$(FUZZ_CALLS) SKV_FUZZ_SEED=$(FUZZ_SEED) SKV_FUZZ_PROBES=$(FUZZ_PROBES) \
		$(CARGO) test --release --test fuzz -- --nocapture

bench:
	$(CARGO) bench

install:
	scripts/install.sh $(PREFIX)

# The committed header must be what cbindgen generates from src/capi.
header-check: build
	git diff --exit-code -- include/skv.h

clean:
	$(CARGO) clean
