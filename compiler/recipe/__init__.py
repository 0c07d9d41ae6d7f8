"""What to build and how: the recipe's schema (`schema.load_recipe`), the run options
(`options.Options`, each defined once with its flag), the plan a recipe resolves to against
the bank without loading a weight (`plan.plan`), and locks (`lock`)."""
