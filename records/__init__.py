"""The ground floor: the records every stage passes on and where they are kept.

  trajectory    the Trajectory record (messages in the chat-template shape, outcome, source)
  review        the Review record (decision, errors, grounded defect spans) and step numbering
  pools         JSON Lines pools on disk (plain or zstd): the one reader, append-and-flush
                writes, atomic rewrites, located errors
  byte_offsets  where each record of a JSONL file starts (plain lines, zstd frames)
  record_index  a lazy, saved index over one JSONL file
  pool_index    the indexes of a pool and its reviews, with per-record summaries
  passk         unbiased pass@k and the per-task table

Nothing here imports a stage (``envs``, ``harness``, ``review``, ``relearn``, ``eval``).
"""
