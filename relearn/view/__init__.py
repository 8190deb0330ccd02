"""``relearn view``: the pool joined with its reviews and dataset figures, and its filters
(``catalog``, over the indexes in ``records.pool_index``); how a message is shown with its
defects marked (``marks``); a trajectory on screen, step by step (``screen``); search hits
marked in it (``hits``); and the Textual viewer (``app``). ``relearn view --print`` writes
the same screens to stdout (``printing``)."""
