"""Who is asking, and may they: authentication and the one authorisation point.

Owns: SigV4 (``sigv4.py``) and SigV2 (``sigv2.py``) verification, header
and presigned, with what both share (``signing.py``), and the decision
asked before any handler runs (``access.py``: ``Access.authorize``, the
table from operation to IAM action, cached per key and policy version).

May import: ``s3``; tiering's identity room for users, keys and policies.
"""
