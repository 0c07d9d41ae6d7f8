"""`python -m ptc.compiler.cli`: the same command as `ptc`."""

from ptc.compiler.cli.main import main

main()
