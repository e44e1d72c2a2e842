"""Reading an object: the plan a read is answered with, and how its bytes
come back from the capacity tier.

Owns: the read protocol between the gateway and tiering (``plan.py``:
``ReadPlan``, bodies and their blocks, tallies), reading extents from the
store into the hot tier (``fetch.py``, with single flight: ``flight.py``;
a large extent sent on as it arrives: ``arrival.py``, in a buffer used
again once nothing holds it: ``buffers.py``) and streaming an
object's pieces while the next are fetched (``readahead.py``), as many in
flight as the source's bandwidth-delay product asks (``window.py``).

May import: the foundation modules of ``tiering``, ``model``, ``capacity``
and ``hot``.
"""
