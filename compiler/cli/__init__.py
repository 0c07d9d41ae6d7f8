"""The command line: `ptc` (`main.main`, the click group an installed `ptc` runs), what every
command shares (`app`: run-option flags, common flags, one-line errors), the commands
(`build_commands`: recipes and their outputs; `bank_commands`: tasks, descriptors,
fine-tunes and the bank), the one table of flags (`flags`) and what commands print
(`tables`, `bank_show`)."""
