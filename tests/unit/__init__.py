"""In-process tests: no subprocess, no server, no network (tests/conftest.py describes the layers)."""
