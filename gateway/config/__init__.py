"""The gateway's configuration: every setting, where its value comes from,
and what it derives from the machine.

Owns: the one ``Config`` object and ``load_config`` (``values.py``), the
table of settings and how each raw value is checked and typed
(``settings.py``), flags against environment against file
(``sources.py``), the secrets generated on first start
(``credentials.py``), byte sizes (``sizes.py``), the cores a process may
use (``cores.py``), the memory it may use and its caches' bounds
(``memory.py``), the allocator it runs on (``allocator.py``) and the
start-up check of TLS files (``tls.py``).

May import: ``gateway.client`` (the names, file format and defaults shared
with clients), ``tiering.settings`` and ``tiering.memo`` (the kinds of cache).
"""
