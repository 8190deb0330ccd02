"""The pipeline runner: ``relearn run PIPELINE.toml`` and ``relearn demo``.

config   the pipeline file (pydantic, strict: unknown fields are errors)
runner   stages run in order, skipped when current (stamps under WORKDIR/.pipeline/)
stages   what each stage calls, and the plan built from a config
report   the final report: every stage's counts, the paper's comparison, PNGs
demo     the main job on this machine: the mini suite, a scripted historical checkpoint, a tiny model
"""
