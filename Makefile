# caddy-warden. `make demo` shows it working on a simulated fleet;
# `make test` is what CI runs. Two Go modules: the plugin at the root, and
# the benchmark harness in bench/ (its own go.mod, `replace` => ../), so that
# the plugin's go.mod lists only what the plugin imports.
GO ?= go
BIN := bin

# From xcaddy.json, the build manifest: Caddy's version and the plugins.
CADDY_VERSION := $(shell sed -n 's/.*"caddy_version": *"\([^"]*\)".*/\1/p' xcaddy.json)
XCADDY_WITH := $(shell sed -n 's/.*"module": *"\([^"]*\)", *"replace": *"\([^"]*\)".*/--with \1=\2/p' xcaddy.json)
XCADDY_VERSION := v0.4.5
PINNED_XCADDY := $(CURDIR)/$(BIN)/tools/xcaddy-$(XCADDY_VERSION)/xcaddy
# xcaddy on PATH, else the pinned one, installed into bin/tools.
XCADDY := $(or $(shell command -v xcaddy 2>/dev/null),$(PINNED_XCADDY))
# A proxy that answers 403 (not 404) for an unpublished module stops `go get` of the replaced plugin; `|off` lets that lookup fall through to the local replacement while Caddy's modules still come from the proxy.
XCADDY_GOPROXY = $$($(GO) env GOPROXY | cut -d, -f1)|off
# The module IDs a Caddy built with the plugin must list (as in
# wardenModules, caddywarden_test.go).
WARDEN_MODULES := warden http.reverse_proxy.selection_policies.warden http.reverse_proxy.upstreams.warden admin.api.warden http.handlers.warden_models http.handlers.warden_panel http.handlers.warden_stop_reason http.matchers.warden_model

# Root module. Unit tests, under the race detector, packages in parallel.
UNIT_PKGS := . ./selection/... ./loadcontrol/... ./fleet/... ./metricsfeed/... ./health/... ./sessionkey/... ./promptprefix/... ./replyend/... ./readahead/... ./inflight/... ./pinsnapshot/... ./livemodel/... ./panel/... ./metrics/... ./internal/... ./cmd/...
# Tests that run servers and processes on loopback ports, close ports and
# expect them refused, or have timing windows: one package at a time, so
# that no other package takes a port one of them just freed. Raced
# (caddymodule also runs Caddy in-process for its leak check).
SERVER_PKGS := ./supervise/... ./pinstore/... ./kvevents/... ./caddymodule/...
# Bench module, the same three groups (paths relative to bench/); the last
# one runs Caddy and vllmsim processes, not raced. clienttest drives the real
# agent CLIs that `npm ci` installs in bench/clienttest (.ci/run does).
BENCH_UNIT_PKGS := ./agentload/... ./hitbound/... ./lab/... ./report/...
BENCH_SERVER_PKGS := ./vllmsim/... ./paneltest/...
BENCH_PROCESS_PKGS := ./e2e/... ./faults/... ./cmd/... ./clienttest/...
# What only the bench may bring into a module graph.
BENCH_ONLY_MODULES := gonum.org/v1/plot|chromedp|cdproto|hdrhistogram|progressbar

.PHONY: all caddy xcaddy-check demo replicas test vet modcheck pkgcheck doccheck bench clean

all: caddy

# Caddy with this plugin, built by xcaddy exactly as the README says, from
# this checkout. No fallback: if xcaddy fails, so does make.
caddy: $(XCADDY)
	@mkdir -p $(BIN)
	GOPROXY="$(XCADDY_GOPROXY)" $(XCADDY) build $(CADDY_VERSION) $(XCADDY_WITH) --output $(BIN)/caddy

$(PINNED_XCADDY):
	GOBIN=$(dir $@) $(GO) install github.com/caddyserver/xcaddy/cmd/xcaddy@$(XCADDY_VERSION)

# CI: the README's build with the pinned xcaddy on an empty module cache
# (what a user who never built this repository gets); the Caddy it builds
# must list every warden module.
xcaddy-check: $(PINNED_XCADDY)
	@set -e; tmp=$$(mktemp -d); trap 'chmod -R u+w "$$tmp"; rm -rf "$$tmp"' EXIT; \
	echo "GOMODCACHE=$$tmp/mod xcaddy build $(CADDY_VERSION) $(XCADDY_WITH)"; \
	GOMODCACHE="$$tmp/mod" GOFLAGS="-modcacherw $$($(GO) env GOFLAGS)" GOPROXY="$(XCADDY_GOPROXY)" \
		$(PINNED_XCADDY) build $(CADDY_VERSION) $(XCADDY_WITH) --output "$$tmp/caddy"; \
	"$$tmp/caddy" list-modules > "$$tmp/modules"; \
	for m in $(WARDEN_MODULES); do \
		grep -qx "$$m" "$$tmp/modules" || { echo "xcaddy's Caddy lacks module $$m"; exit 1; }; \
		echo "listed: $$m"; \
	done

demo:
	$(GO) -C bench run ./cmd/wardenbench demo -out $(CURDIR)/wardenbench-demo

# The README's quick start without a GPU: two simulated vLLM replicas on its
# ports, serving its model name with its context length, until interrupted.
# They answer with placeholder text at an RTX A4000's speed (bench/vllmsim).
QUICKSTART_SIM := --served-model-name qwen3-coder --max-model-len 65536 --num-gpu-blocks 8192 --output-len uniform:16:256
replicas:
	@mkdir -p $(BIN)
	$(GO) -C bench build -o $(CURDIR)/$(BIN)/vllmsim ./cmd/vllmsim
	$(BIN)/vllmsim --port 8001 $(QUICKSTART_SIM) & $(BIN)/vllmsim --port 8002 $(QUICKSTART_SIM); wait

vet: modcheck pkgcheck doccheck
	$(GO) vet ./...
	$(GO) -C bench vet ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }

# The README stays under 300 lines, and every relative link of the user
# docs resolves (to a file, and to a heading for a #fragment).
doccheck:
	$(GO) run ./internal/doccheck -max-readme-lines 299 README.md CHANGELOG.md docs

# Every package is in one of the test lists above: one in none would have
# its tests skipped by make test.
pkgcheck:
	@unlisted=$$({ $(GO) list ./...; $(GO) list $(UNIT_PKGS) $(SERVER_PKGS); \
		$(GO) -C bench list ./...; $(GO) -C bench list $(BENCH_UNIT_PKGS) $(BENCH_SERVER_PKGS) $(BENCH_PROCESS_PKGS); } | sort | uniq -u); \
	test -z "$$unlisted" || { echo "packages in no test list of the Makefile:"; echo "$$unlisted"; exit 1; }

# Both go.mod files tidy, and the plugin's module graph free of the bench's
# dependencies.
modcheck:
	$(GO) mod tidy -diff
	$(GO) -C bench mod tidy -diff
	@! $(GO) mod graph | grep -E '$(BENCH_ONLY_MODULES)' || { echo "bench-only modules in the plugin's module graph"; exit 1; }

test: vet
	$(GO) test -count=1 -race $(UNIT_PKGS)
	$(GO) -C bench test -count=1 -race $(BENCH_UNIT_PKGS)
	$(GO) test -count=1 -race -p 1 $(SERVER_PKGS)
	$(GO) -C bench test -count=1 -race -p 1 $(BENCH_SERVER_PKGS)
	$(GO) -C bench test -count=1 -p 1 $(BENCH_PROCESS_PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./selection/

clean:
	rm -rf $(BIN)
