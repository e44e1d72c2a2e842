"""Getting ahead of the trainer: epoch hints and warm jobs.

Owns: the orders and key sets a trainer names (``order.py``), one
registered epoch and its readers' positions (``epoch.py``), the epochs of a
node (``epochs.py``), the prefetcher that fetches ahead of them and the
eviction order it advises (``prefetcher.py``), and warm jobs
(``warm.py``).

May import: the foundation modules of ``tiering``, ``model``,
``capacity``, ``index``, ``hot``, ``reads``, ``cluster`` and ``mounts``.
"""
