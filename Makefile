# den: see README.md. Every target is idempotent.
SHELL := /bin/bash
GO ?= go
BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)
# Where the guest images are built (see image/); tests find them here.
IMAGE_DIR ?= $(CURDIR)/build/images
export DEN_IMAGE_DIR := $(IMAGE_DIR)

.PHONY: all deps deps-apt deps-go deps-tools deps-ch deps-node build image test test-unit test-loaded test-postgres lint bench demo demo-cluster clean

all: build

## deps: apt packages and pinned tools (juicefs, minio, cloud-hypervisor where reachable, the e2b SDK for its test)
deps: deps-apt deps-go deps-tools deps-ch deps-node

deps-apt:
	@scripts/deps-apt.sh

deps-go:
	@echo "deps: go modules"; $(GO) mod download

deps-tools:
	@scripts/deps-tools.sh

deps-ch:
	@scripts/deps-ch.sh

deps-node:
	@scripts/deps-node.sh

## build: den and den-agent into bin/
build:
	@mkdir -p $(BIN)
	@echo "build: bin/den"; CGO_ENABLED=0 $(GO) build -o $(BIN)/den ./cmd/den
	@echo "build: bin/den-agent (static)"; CGO_ENABLED=0 $(GO) build -ldflags='-s -w' -o $(BIN)/den-agent ./cmd/den-agent

## image: the guest kernel, initramfs and root filesystems (cached by inputs)
image: build
	@scripts/build-image.sh $(IMAGE_DIR)

## test: deps, then every test (real QEMU guests, real JuiceFS on MinIO).
## One package at a time: the e2e and image packages each boot TCG guests,
## and both at once on 2 cores once stalled a guest past its 4 min boot.
test: deps build image
	$(GO) test -p 1 -count=1 -timeout 75m ./...
	DEN_TEST_REGISTRY=postgres $(GO) test -count=1 -timeout 20m ./machine/
	DEN_E2E_REGISTRY=postgres $(GO) test -count=1 -timeout 20m -run 'TestCheckpointRestoreFork$$|TestCrashDuringCheckpointAndRestore$$|TestLocalUsers$$|TestAPITokens$$' ./e2e/

## test-unit: the tests that need neither root nor images
test-unit:
	$(GO) test -short -count=1 ./...

## test-postgres: the machine and e2e suites whole with the registry on
## PostgreSQL (make test runs a part of the e2e suite so, for its time)
test-postgres: deps build image
	DEN_TEST_REGISTRY=postgres $(GO) test -count=1 -timeout 20m ./machine/
	DEN_E2E_REGISTRY=postgres $(GO) test -count=1 -timeout 70m ./e2e/

## test-loaded: the e2e suite three times with every CPU busy (after make test)
test-loaded: build image
	@scripts/test-loaded.sh 3

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt: not formatted:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

bench: deps build image
	@scripts/bench.sh

demo: deps build image
	@scripts/demo.sh

## demo-cluster: three hosts sharing PostgreSQL and a JuiceFS volume on MinIO
demo-cluster: deps build image
	@scripts/demo-cluster.sh

clean:
	rm -rf $(BIN) build
