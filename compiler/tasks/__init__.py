"""Tasks as files: task YAML files and their grids of probes x prompts (`grid.load_task`,
`grid.grid_hash`), and labelled folders for evaluation and fine-tuning (`labelled`)."""
