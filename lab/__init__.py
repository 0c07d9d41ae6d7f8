"""The lab: the offline zoo (generated worlds, pretraining, sources), the paper's harness, the
trials and the benchmarks' fixtures. It proves the product and is not part of it: nothing in
ptc.compiler or ptc.targets imports it. Installed with the `lab` extra, it plugs its commands
(`ptc zoo`, `ptc paper`, `ptc bench`, `ptc demo`) and its `zoo:` scheme into the product
through entry points (plugin.py), exactly as a third party would."""
