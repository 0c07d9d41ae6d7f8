"""Serving without torch: the contract an output's `onnx/` folder carries beside its graphs
(`contract`: preprocessing as data, the tokenizer, the padding rule), the client that follows
it with numpy, PIL and onnxruntime alone (`preprocess`, `client`), and zero-shot accuracy
through that client (`zero_shot`). Nothing here imports torch (an import contract holds it):
it is the serving host's code, run by the build on the check inputs before anything ships."""
