"""Offline corpora the environments search: built from the machine, cached under ``data/cache``."""
