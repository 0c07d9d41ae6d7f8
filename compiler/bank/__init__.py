"""The operator bank on disk: tasks, cached embeddings, descriptors, target factors and
operators, each a sealed safetensors entry (`store.Bank`, `store.default_bank_dir`). It knows
files and hashes, not math."""
