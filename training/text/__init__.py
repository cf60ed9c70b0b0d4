"""Text data for every language model: read records (records.py), turn each into tokens and a loss mask by its
format (formats.py), pack them into sequences (packing.py), once per run and data, in a memory-mapped cache
(cache.py)."""
