# libskv's commands. `make test` is the one test command; `make sim` runs the main job.
PREFIX ?= /usr/local
CARGO ?= cargo
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)
# build.rs generates the header here (and into OUT_DIR); include/skv.h is its committed copy.
GENERATED_HEADER = $(TARGET_DIR)/release/include/skv.h
# ... and the dlopen table's pinned order (src/capi/api.list, append-only within an ABI).
GENERATED_API_LIST = $(TARGET_DIR)/release/include/api.list

.PHONY: all build deps test test-rust test-events test-zmq test-c test-c-events test-integration nixl-test doc-check sim fuzz bench install header header-check lint clean

all: build

build:
	$(CARGO) build --release -p skv

# Everything CI runs: Rust unit, property and smoke tests; the C suite plain, under
# AddressSanitizer, UndefinedBehaviorSanitizer and valgrind; the installed-package consumers;
# sessions moved between two processes by NIXL.
test: deps test-rust test-events test-zmq test-c test-c-events test-integration nixl-test

# cmake, pkg-config, valgrind, a C++ compiler and pip (apt-get as root when missing).
deps:
	scripts/deps.sh

test-rust: | deps
	$(CARGO) test
	$(CARGO) test --benches
	$(CARGO) test -p skv --features cuda --test device -- --nocapture

# KV events (--features events) decoded and indexed by Dynamo's router, dynamo-kv-router (a
# dev-dependency; its first build takes a few minutes): the format, then the session calls'
# events through the C ABI (scenarios and the differential), then the simulator's instances
# routed by them (skv-sim's `router` feature); the events bench's smoke run.
test-events:
	$(CARGO) test --features events --test events_dynamo
	$(CARGO) test --features events --test events_session
	$(CARGO) test --features events --bench hot_path
	$(CARGO) test -p skv-sim --features router --test multi
	$(CARGO) test --features events --bench events

# The ZMQ publisher (--features zmq) against a real subscriber. zmq-sys builds libzmq from
# source with the C++ compiler (scripts/deps.sh): about 2 minutes on two cores, once, shared
# with lint's `clippy -p skv --features zmq` (the same -p, so the same build of zmq-sys).
test-zmq: | deps
	$(CARGO) test -p skv --features zmq --test events_zmq

# docs/events.md's drain path (ctests/test_doc_events.c) against a library built with the
# events feature, in its own target dir: test-c runs the same program against the default
# build, where every events call is SKV_ERR_UNSUPPORTED.
test-c-events: | deps
	$(CARGO) build --release -p skv --features events --target-dir $(TARGET_DIR)/events
	SKV_CTEST_ONLY=test_doc_events.c ctests/run.sh $(abspath $(TARGET_DIR))/events/release
	SKV_CTEST_ONLY=test_doc_events.c SKV_CTEST_VALGRIND=1 ctests/run.sh $(abspath $(TARGET_DIR))/events/release

test-c: build | deps
	ctests/run.sh target/release
	SKV_CTEST_SANITIZE=address ctests/run.sh target/release
	SKV_CTEST_SANITIZE=undefined ctests/run.sh target/release
	SKV_CTEST_VALGRIND=1 ctests/run.sh target/release
# The hot-path bench's smoke run with its calls through the shared library, as
# SKV_BENCH_LIB measures it.
	SKV_BENCH_LIB=$(abspath $(TARGET_DIR))/release/libskv.so $(CARGO) test --bench hot_path

test-integration: build | deps
	ctests/integration.sh --no-build

# Sessions moved back and forth between two processes by NIXL's UCX backend over loopback TCP,
# both modes and a hybrid model, with failures injected (docs/transfer-nixl.md). The pinned
# NIXL wheel and header come from PyPI and crates.io (scripts/nixl_fetch.sh: the network
# once); without them this fails, it never skips.
nixl-test: build | deps
	scripts/nixl_fetch.sh $(TARGET_DIR)/nixl
	ctests/nixl/run.sh $(TARGET_DIR)/release $(TARGET_DIR)/nixl

# The docs hold together: links resolve, every rule docs/rules.list names is in docs/
# (part of test-rust's cargo test; this runs it alone).
doc-check:
	$(CARGO) test --test docs

# The cheap gates: formatting, clippy with warnings denied (its incompatible_msrv lint holds
# the code to Cargo.toml's rust-version), rustdoc without warnings, no import circle in src/.
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p skv --all-targets --features cuda -- -D warnings
	$(CARGO) clippy -p skv --all-targets --features events -- -D warnings
	$(CARGO) clippy -p skv --all-targets --features zmq -- -D warnings
	$(CARGO) clippy -p skv-sim --all-targets --features router -- -D warnings
	RUSTDOCFLAGS=-Dwarnings $(CARGO) doc --no-deps --features skv/events
	python3 scripts/check_modules.py src

sim:
	$(CARGO) run --release --bin skv-sim

# The long fuzz run (cargo test runs 100,000 calls), every probe class on (FUZZ_PROBES=none turns them off).
FUZZ_CALLS ?= 10000000
FUZZ_SEED ?= 0x10c0ffee
fuzz:
	SKV_FUZZ_CALLS=$(FUZZ_CALLS) SKV_FUZZ_SEED=$(FUZZ_SEED) SKV_FUZZ_PROBES=$(FUZZ_PROBES) \
		$(CARGO) test --release --test fuzz -- --nocapture

bench:
	$(CARGO) bench

# make install PREFIX=/opt/skv INSTALL_FLAGS=--debug-info keeps the debug info in lib/.debug
install:
	scripts/install.sh $(INSTALL_FLAGS) $(PREFIX)

# Refreshes include/skv.h from what build.rs generated from src/capi.
header: build
	cp $(GENERATED_HEADER) include/skv.h
	cp $(GENERATED_API_LIST) src/capi/api.list

# The committed header must be what cbindgen generates from src/capi (committed or not), and
# its layout (every struct's sizeof and offsetof, enum values, constants) what
# ctests/abi_layout.txt records: an ABI change is a reviewed diff there.
header-check: build
	@diff -u include/skv.h $(GENERATED_HEADER) || \
	  { echo "include/skv.h differs from the generated header: run make header" >&2; exit 1; }
	@diff -u src/capi/api.list $(GENERATED_API_LIST) || \
	  { echo "src/capi/api.list lacks a new export: run make header" >&2; exit 1; }
	python3 scripts/abi_layout.py check

clean:
	$(CARGO) clean
