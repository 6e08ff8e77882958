"""Measuring tools that sit on top of the library: speed (`bench`), numeric fidelity
(`fidelity`), kernel-vs-reference parity (`kernel_parity`) and the end-to-end GPU check
(`gpu_check`). The library itself (ops, nn, precision, callbacks, models, data) never
imports this package; the CLI runs these as `python -m sru_lightning <command>`."""
