"""The ROSS trainer: masked teacher forcing over whole trajectories at long context.

Modules, from the inside out:
  loss              the objective: LM head + cross-entropy only at supervised positions, in checkpointed chunks
  data              Parquet shards -> validated samples -> per-epoch plans -> padded or packed micro-batches
  model             building/loading causal LMs (tiny test configs included) and the loss-computing wrapper
  deepspeed_config  the DeepSpeed config generated from the command-line flags
  loop              run management: engine, schedule, checkpoints, resume, metrics, final Hugging Face weights

Heavy imports (torch, transformers, deepspeed) live in those modules, never here, so that
``import relearn.train`` stays cheap for the command line.
"""
