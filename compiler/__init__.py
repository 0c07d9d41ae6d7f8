"""The compiler: a recipe of signed task sums in, a verified edited encoder out.

Its rooms follow a build's stages, each a package whose docstring names its job (the layers
between them are docs/architecture.md's, checked by `lint-imports`):

    cli      the command line          build    the pipeline: execute(plan)
    sources  filling the bank          export   ONNX, checkpoint, Triton, model card
    edit     descriptors -> edit       verify   checks, certificate, evaluation
    serve    the serving contract and its ONNX-only client (no torch)
    recipe   schema, options, plan     embed    task grids, embedded once
    bank     the operator bank         tasks    task files and grids
    method   the paper's math on tensors
"""
