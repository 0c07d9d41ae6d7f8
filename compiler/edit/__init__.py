"""From descriptors to an edited model: the descriptor each term uses (`terms`), label-free
strengths (`strength`), cached target factors and operators (`operators`), and the two
routes (`routes.ROUTES`): the closed form folded into the last affine layer, and a LoRA
adapter (`adapter`, trained by `lora`) merged into the weights."""
