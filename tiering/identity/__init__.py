"""Who may do what: users, their access keys, policies, bucket policies
and canned ACLs (docs/users-and-policies.md).

Owns: IAM-style policy documents, parsed and evaluated without I/O
(``policy.py``) and the ready-made ones (``builtin.py``); the one document
that holds every user, key, named policy, bucket policy and canned ACL, and
the changes to it (``state.py``); the snapshot the data plane asks, built
from it (``directory.py``); secrets sealed at rest with AES-GCM under a key
kept apart from the index (``sealing.py``); the document in the capacity
store beside the leases, changed with conditional writes and followed by
every node (``store.py``).

May import: the foundation modules (``tiering.errors``, ``pool``, ...) and
``capacity``. The data plane's authorisation point is the gateway's
(``gateway/auth/access.py``); this room decides, it does not route.
"""
