"""Several gateways over one capacity store.

Owns: write leases per bucket (``lease.py``), write terms and seals
(``terms.py``), following other writers' segments and holding this node's
(``cluster.py``, reading their footers ahead: ``footers.py``; what it keeps
of that: ``state.py``; a takeover's catch-up: ``catchup.py``), when a node
follows (``news.py``: the follow head of ``head.py``, read conditionally,
and the notices of ``push.py``), which buckets this node may write
segments for and how it names them (``writing.py``), the registry of live
nodes (``members.py``), and other gateways as a source of cached bytes
(``peers.py``).

May import: the foundation modules (``tiering.errors``, ``meta``,
``settings``, ``pool``, ...), ``model``, ``capacity``, ``index``, ``hot``
and ``reads``. Coordination goes through the capacity store alone.
"""
