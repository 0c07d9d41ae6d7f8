"""Writing what a build ships, one job a module: ONNX graphs exported, saved and described
(`onnx_graph`), run with onnxruntime (`onnx_run`), their fp16 and int8 variants (`fp16`,
`int8`), the serving contract beside them (`serving`), base towers cached in the bank and
patched with an edit (`tower_cache.write_tower`), the checkpoint's provenance stamp (`stamp`),
the Triton repository (`triton`), and the model card with its picture (`card`, `card_plot`)."""
