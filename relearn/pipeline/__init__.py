"""The pipeline runner: ``relearn run PIPELINE.toml`` and ``relearn demo``.

config   the pipeline file (pydantic, strict: unknown fields are errors)
runner   stages run in order, skipped when current (stamps under WORKDIR/.pipeline/)
context  what stages share, and the work folder's layout
stages   one module per stage: when it applies, its identity, outputs and needs, its run
plan     the stages of a config in order, and running them
report   the final report: every stage's counts, the paper's comparison, PNGs
demo     the main job on this machine: the mini suite, a scripted historical checkpoint, a tiny model
"""
