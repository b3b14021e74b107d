# caddy-warden. `make demo` shows it working on a simulated fleet;
# `make test` is what CI runs.
GO ?= go
BIN := bin

# From xcaddy.json, the build manifest: Caddy's version and the plugins.
CADDY_VERSION := $(shell sed -n 's/.*"caddy_version": *"\([^"]*\)".*/\1/p' xcaddy.json)
XCADDY_WITH := $(shell sed -n 's/.*"module": *"\([^"]*\)", *"replace": *"\([^"]*\)".*/--with \1=\2/p' xcaddy.json)

# Unit tests, under the race detector, packages in parallel.
UNIT_PKGS := ./selection/... ./metricsfeed/... ./health/... ./sessionkey/... \
	./bench/agentload/... ./bench/hitbound/... ./bench/lab/... ./bench/report/... ./internal/...
# Tests that run servers and processes on loopback ports, close ports and
# expect them refused, or have timing windows: one package at a time, so
# that no other package takes a port one of them just freed. The first
# group is raced (caddymodule also runs Caddy in-process for its leak check).
SERVER_PKGS := ./supervise/... ./bench/vllmsim/... ./caddymodule/...
PROCESS_PKGS := ./bench/e2e/... ./bench/faults/... ./cmd/...

.PHONY: all caddy demo test vet bench clean

all: caddy

# Caddy with this plugin: xcaddy when installed (offline, from the module
# cache), else the repository's cmd/caddy, which is what xcaddy generates.
caddy:
	@mkdir -p $(BIN)
	@if command -v xcaddy >/dev/null 2>&1; then \
		echo "xcaddy build $(CADDY_VERSION) $(XCADDY_WITH)"; \
		GOPROXY=off xcaddy build $(CADDY_VERSION) --output $(BIN)/caddy $(XCADDY_WITH) \
		|| $(GO) build -o $(BIN)/caddy ./cmd/caddy; \
	else \
		$(GO) build -o $(BIN)/caddy ./cmd/caddy; \
	fi

demo:
	$(GO) run ./cmd/wardenbench demo

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { gofmt -l .; echo "gofmt needed"; exit 1; }

test: vet
	$(GO) test -count=1 -race $(UNIT_PKGS)
	$(GO) test -count=1 -race -p 1 $(SERVER_PKGS)
	$(GO) test -count=1 -p 1 $(PROCESS_PKGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./selection/

clean:
	rm -rf $(BIN)
