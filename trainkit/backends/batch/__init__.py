"""The AWS Batch backend: a job as a multi-node parallel (MNP) Batch job (README.md in this folder)."""
