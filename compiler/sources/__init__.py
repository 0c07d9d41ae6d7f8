"""Filling the bank from source models: one source's descriptor (`descriptor.add_descriptor`,
`ptc descriptor add`), every source, task and target of a bank plan in bulk (`bank_plan`,
`bulk.fill_bank`, `bulk_ray.fill_bank_on_ray`: `ptc bank build`), and making a source by
fine-tuning (`finetune.finetune_lora`, `ptc finetune`)."""
