"""Capacity-tier layout, sans-I/O.

Pure functions and value types shared by the layers above: byte ranges now,
and the segment format, split planning and zstd framing as the capacity tier
arrives. Nothing here touches sockets, the event loop, files or rocksdict.
"""
