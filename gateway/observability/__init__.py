"""What the gateway says about itself: metrics and the access log.

Owns: the Prometheus series and the ``/stats`` view of the data plane
(``metrics.py``) and one access-log line per S3 request
(``accesslog.py``).

May import: ``config`` and ``s3``.
"""
