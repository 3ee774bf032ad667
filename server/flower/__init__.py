"""Thin wrappers on Flower's public API: the Grid wrappers (signing, array exchange) and the `flwr run` entry."""
