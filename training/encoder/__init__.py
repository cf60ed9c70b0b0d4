"""Encoder pretraining (BERT): masked-language-model data and, as issue 31 lands, its trainer."""
