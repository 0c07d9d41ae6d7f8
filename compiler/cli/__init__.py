"""The command line: `ptc` and its commands (`main`), the one table of flags every command
builds its options from (`flags`), and the tables commands print (`tables`, `bank_show`).

Public: `ptc.compiler.cli.main.main`, the click group an installed `ptc` runs."""
