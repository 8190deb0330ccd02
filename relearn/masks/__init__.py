"""The masks stage (``relearn masks``): a verified, reviewed pool into token data, m = A \\ E.

In the order a trajectory goes through them:
  tokenizers  the target tokenizer and chat template (Qwen3.6 built offline, or any HF folder)
  template    render the whole trajectory once with the chat template; locate each
              generated turn and each field inside it
  compile     A (eligible tokens) minus E (tokens touching a defect), VALIDATE, one Sample
  shards      the pool compiled into Parquet shards and statistics, resumable by shard
"""
