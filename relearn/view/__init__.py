"""``relearn view``: a lazy index over pools and reviews (``index``, ``offsets``), the pool
joined with reviews and dataset figures and its filters (``catalog``), the rich rendering
shared by the viewer and ``--print`` (``render``), and the Textual viewer (``app``)."""
