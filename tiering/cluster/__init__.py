"""Several gateways over one capacity store: write leases per bucket
(``lease.py``), terms, following and seals (``cluster.py``), which buckets
this node may write segments for (``writing.py``), and other gateways as a
source of extents (``peers.py``)."""
