"""Published numbers the tests check against."""

from __future__ import annotations

# Llama 2 parameter counts as the Hugging Face checkpoints report them (untied embedding and LM head).
N7, N13, N70 = 6_738_415_616, 13_015_864_320, 68_976_648_192
