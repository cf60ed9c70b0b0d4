"""Running a job's processes wherever it runs: the torchrun agent and what its workers report."""
