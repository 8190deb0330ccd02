"""``relearn stats``: what a pool, its reviews and its datasets hold, counted (``compute``),
drawn (``plots``) and tabled (``tables``). It reads records only, through the saved indexes of
``records.pool_index``, and runs no model; the comparisons between pools and under a model are
``relearn analyze``."""
