# Verbatim: the two commands are `make run` and `make test` (see README.md).
# Both create/update .venv in the repository root (quietly, skipped when nothing changed).
# Choose the interpreter with PYTHON=/path/to/python3.x (3.11 or newer).

SHELL := /bin/bash
.DEFAULT_GOAL := help
ARGS ?=

.PHONY: help run chat test bench bench-blas venv constraints icons demo-stage briefcase-check clean distclean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

run: ## set up .venv and open the Verbatim window (no display on Linux: prints how to run it)
	@scripts/run.sh gui $(ARGS)

chat: ## set up .venv and chat in the terminal with the built-in demo model
	@scripts/run.sh chat $(ARGS)

test: ## set up .venv and run the whole test suite (ARGS="-k name" to select)
	@scripts/test.sh $(ARGS)

bench: ## run the benchmark suite, bench/run_all.py
	@scripts/bench.sh all $(ARGS)

bench-blas: ## measure MLX f32 prefill with and without OpenBLAS (Linux)
	@scripts/bench.sh blas $(ARGS)

venv: ## create/update .venv only
	@scripts/venv.sh test

constraints: ## re-resolve constraints.txt (exact versions within pyproject's bounds; network)
	@scripts/constraints.sh

icons: venv ## re-render app icons from packaging/icon.svg
	@.venv/bin/python packaging/make_icons.py

demo-stage: venv ## copy the demo model into build/demo/ for `briefcase create macOS`
	@.venv/bin/python packaging/stage_demo_model.py

briefcase-check: ## run the app's self-check through `briefcase dev` (isolated env)
	@scripts/briefcase_check.sh

clean: ## remove build outputs, caches and briefcase's dev environment (keeps .venv)
	rm -rf build dist .briefcase .pytest_cache logs packaging/briefcase/verbatim.dist-info *.egg-info
	find . \( -path ./.venv -o -path "./.venv-*" \) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean ## also remove .venv
	rm -rf .venv .venv-*
