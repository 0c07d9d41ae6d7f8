"""The offline zoo: a generated world, dual encoders pretrained on it, sources fine-tuned per task."""
