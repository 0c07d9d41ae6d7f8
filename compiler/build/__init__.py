"""The build pipeline (mergekit's execute half): `execute(plan, options)` loads the target,
embeds its grids, lets the recipe's route make the edit, verifies it and writes the output
into a staging folder renamed into place only when every check passed.

Public: `pipeline.execute`, `report.BuildReport`."""
