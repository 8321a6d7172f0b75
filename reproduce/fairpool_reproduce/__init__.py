"""fairpool_reproduce: the papers' headline results, re-run on the simulator.

A program, not a library: `python -m fairpool_reproduce` (`make reproduce`) runs every
experiment and writes `docs/results.md` and `docs/img/results-*.png`; `--only chains`
regenerates section 8 in place. Modules: `results` (the VTC and DLPM experiments, and the
report), `serving` (memory-safe admission and SLAI, seeds 002 and 004), `chains` (pipeline
chains against PETALS and BPRR, seed 003). It imports the core library; nothing imports it.
"""
