"""ptc, the platonic task compiler: recipes of signed task sums -> edited dual encoders.

One import namespace over the repository's folders (ptc/compiler, ptc/targets and ptc/lab
are links to them; docs/architecture.md):

    ptc            ptc/        the core every part shares: errors, finite checks, hashing, timers,
                               atomic files, output folders, progress, devices, strict YAML,
                               reading probe files (media)
    ptc.compiler   compiler/   in rooms named for the build's stages (compiler/__init__.py)
    ptc.targets    targets/    one module per model family behind the DualEncoder protocol
    ptc.lab        lab/        the offline zoo, the paper's harness and the trials (extra: lab)
    ptc.lab.benchmarks  benchmarks/

The product (ptc, ptc.compiler, ptc.targets) imports nothing of the lab; the lab plugs its
commands and its `zoo:` scheme in through entry points, as a third party would.
"""

__version__ = "0.1.0"
