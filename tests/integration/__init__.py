"""Tests against real tools and servers, without training (tests/conftest.py describes the layers)."""
