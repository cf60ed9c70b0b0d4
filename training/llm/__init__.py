"""Decoder fine-tuning and pretraining: the Llama 2 recipes and any Hugging Face causal LM trainkit sizes
(training/decoders.py `DECODER_TYPES`), under FSDP2 through Accelerate; its data comes from training/text/."""
