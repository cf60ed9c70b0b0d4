"""Benchmarks (`invoke bench ...`, results written to benchmarks/): trainkit against the bare loop a user would
write (train.py runs them, record.py measures and records), and chaos: faults injected into real elastic jobs."""
