"""Fixes for development machines, applied by `make setup`; never part of a training image."""
