"""Real training processes end to end (tests/conftest.py describes the layers)."""
