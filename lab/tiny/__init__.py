"""Tiny random-weight models of every family, built offline from configs with real tokenizers
and processors (word-level vocabularies trained on prompt English, lab/tiny_vocab.py): for the
tests, the demo, the benchmarks' fixtures and the zoo. Each saves a checkpoint in its library's
own format, which the product loads like any other."""
