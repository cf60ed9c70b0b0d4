"""Accelerate FSDP fine-tuning of Llama 2 on instruction data (prompt + response)."""
