"""ptc, the platonic task compiler: recipes of signed task sums -> edited dual encoders.

One import namespace over the repository's folders (pyproject.toml maps them):

    ptc            ptc/        the version, typed errors and hashing every part shares
    ptc.compiler   compiler/   recipe -> plan -> execute -> verify -> export, the bank, the CLI
    ptc.targets    targets/    one module per model family behind the DualEncoder protocol
    ptc.lab        lab/        the offline zoo, the paper's harness and the trials (extra: lab)
    ptc.lab.benchmarks  benchmarks/

The product (ptc, ptc.compiler, ptc.targets) imports nothing of the lab; the lab plugs its
commands and its `zoo:` scheme in through entry points, as a third party would.
"""

__version__ = "0.1.0"
