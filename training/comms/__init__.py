"""Collective benchmarks run inside a job: the sweep behind `invoke nccl-test`, and the NCCL init-log check."""
