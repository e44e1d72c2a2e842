"""S3 operation handlers: ``async def op(ctx, req) -> Response`` each.

Owns too: ``context.py``, what every handler gets besides its request.

May import: ``auth``, ``config``, ``s3`` and ``serving``; tiering's read and
write entry points.
"""
