"""Writing what a build ships: ONNX towers exported and run (`writers`), base towers cached
in the bank and patched with an edit (`tower_cache`), the checkpoint's stamp, fp16
variants, the Triton repository, the model card and its picture (`card_plot`)."""
