"""The ROSS trainer: masked teacher forcing over whole trajectories at long context.

Modules, from the inside out:
  loss              the objective: LM head + cross-entropy only at supervised positions, in checkpointed chunks
  data              Parquet shards -> validated samples -> per-epoch plans -> padded or packed micro-batches
  model             building/loading causal LMs (tiny test configs included) and the loss-computing wrapper
  deepspeed_config  the DeepSpeed config generated from the command-line flags
  options           the flags, the settings that define a run, and the checks that refuse bad ones
  engines           plain PyTorch or DeepSpeed, the process group, the learning-rate schedule
  checkpoints       the run folder: checkpoints, identity, metrics, final Hugging Face weights
  loop              ``train()``: the loop itself, on one screen

Heavy imports (torch, transformers, deepspeed) live in those modules, never here, so that
``import relearn.train`` stays cheap for the command line.
"""
