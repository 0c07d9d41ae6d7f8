#!/usr/bin/env bash
# The README's worked example, exactly as the README shows it (tests/test_readme.py runs this
# file and checks that the README holds its text). Run from the repository root after
# `pip install -e .`; it writes example-bank/ and recipes/dist/example-edit/.
set -euo pipefail

# 1. a task: unlabelled probes and class prompts, kept in version control
cat zoo/world/tasks/shape/task.yaml
ptc task add zoo/world/tasks/shape/task.yaml --bank example-bank
ptc task add zoo/world/tasks/background/task.yaml --bank example-bank   # the recipe's control

# 2. a descriptor from a source model and its fine-tune (a peft LoRA folder or a full checkpoint;
#    `ptc finetune --task shape --source hf:zoo/models/siglip --data DIR --out DIR` trains one)
ptc descriptor add --task shape --source hf:zoo/models/siglip --finetuned zoo/sources/siglip/shape-s0 \
    --id siglip --bank example-bank

# 3. a recipe, checked without loading weights, then built (its output is relative to the recipe)
cat recipes/example.yaml
ptc check recipes/example.yaml --bank example-bank
ptc build recipes/example.yaml --bank example-bank --force     # -> recipes/dist/example-edit/

# 4. the edited model's held-out accuracy, then the unedited target's
ptc eval recipes/dist/example-edit --task shape --data zoo/world/tasks/shape/test --bank example-bank
ptc eval hf:zoo/models/clip --task shape --data zoo/world/tasks/shape/test --bank example-bank
