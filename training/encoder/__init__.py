"""Encoder pretraining (BERT): masked-language-model data, masking and its trainer (DeepSpeed ZeRO-1 or DDP)."""
