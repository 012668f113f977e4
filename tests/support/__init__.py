"""Shared test helpers (one package, instead of imports from other folders' conftest.py)."""
