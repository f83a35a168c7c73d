"""Backends: the adapter contract, the registry, and one module per backend."""
