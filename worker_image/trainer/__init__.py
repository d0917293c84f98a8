"""Regatta trainer: one process per rank under torchrun."""
